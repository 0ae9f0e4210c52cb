/*
 * The core API as a table of function pointers, with the exact signatures of
 * fab_core.h. Consumers that must drive the plugin "the way NCCL does"
 * (functional tests, netbench) are written once against this table; the
 * generator renders, for every ABI version, a driver that fills it by calling
 * through that version's own exported table (generated/drivers/). fab_api_core
 * fills it with the core functions themselves.
 *
 * Drivers for versions that lack a member (for example init with a context
 * before v11) adapt: init_ctx falls back to the version's own init, and an
 * absent optional member is NULL.
 */
#ifndef FAB_API_H
#define FAB_API_H

#include "fab_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fab_api {
  const char* name;      /* the table's name string, e.g. "Fabric" */
  int version;           /* ABI version the driver calls through; 0 for the core itself */
  int size_is_int;       /* 1 when isend/irecv take int sizes (net v6..v8) */
  int max_handle_size;   /* bytes of the connection handle */

  fab_result (*init)(fab_ctx** ctx, uint64_t comm_id, const fab_comm_config* config, fab_logger_fn logger,
                     fab_profiler_fn profiler);
  fab_result (*finalize)(fab_ctx* ctx);
  fab_result (*devices)(int* ndev);
  fab_result (*get_properties)(int dev, fab_properties* props);
  fab_result (*make_vdevice)(int* dev, const fab_vdevice_props* props);
  fab_result (*set_net_attr)(fab_ctx* ctx, const fab_net_attr* attr);
  fab_result (*listen)(fab_ctx* ctx, int dev, void* handle, void** listen_comm);
  fab_result (*connect)(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, void** send_comm,
                        void** dev_handle);
  fab_result (*accept)(void* listen_comm, void** recv_comm, void** dev_handle);
  fab_result (*close_send)(void* send_comm);
  fab_result (*close_recv)(void* recv_comm);
  fab_result (*close_listen)(void* listen_comm);
  fab_result (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  fab_result (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                              void** mhandle);
  fab_result (*dereg_mr)(void* comm, void* mhandle);
  fab_result (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                      void** request);
  fab_result (*irecv)(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
                      void** phandles, void** request);
  fab_result (*iflush)(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
  fab_result (*test)(void* request, int* done, int* sizes);
  /* one-sided calls on a connection: Neuron v5+ tables (NULL elsewhere) */
  fab_result (*get_mr_key)(void* mhandle, uint64_t* mr_key);
  fab_result (*iwrite)(void* send_comm, void* src, size_t size, void* src_mhandle, uint64_t dest, uint64_t mr_key,
                       void** request);
  fab_result (*iwrite_inline)(void* send_comm, void* src, size_t size, uint64_t dest, uint64_t mr_key,
                              void** request);
  fab_result (*iread)(void* recv_comm, void* dest, size_t size, void* dest_mhandle, uint64_t src, uint64_t mr_key,
                      void** request);
} fab_api;

/* The same for NCCL's RMA tables (one-sided groups). */
typedef struct fab_rma_api {
  const char* name;
  int version;
  int size_is_int;       /* always 0 */
  int max_handle_size;

  fab_result (*init)(fab_ctx** ctx, uint64_t comm_id, fab_logger_fn logger);
  fab_result (*finalize)(fab_ctx* ctx);
  fab_result (*devices)(int* ndev);
  fab_result (*get_properties)(int dev, fab_properties* props);
  fab_result (*get_rma_properties)(void* group, fab_rma_properties* props); /* v16+ */
  fab_result (*listen)(fab_ctx* ctx, int dev, void* handle, void** listen_comm);
  fab_result (*connect)(fab_ctx* ctx, void** handles, int nranks, int rank, int n_contexts, void* listen_comm,
                        void** group, const volatile uint32_t* abort_flag);
  /* NULL in GIN v11/v12 (pass the comm where a context goes) */
  fab_result (*create_context)(void* group, const fab_rma_config* config, void** rma_ctx, void** dev_handle);
  fab_result (*reg_mr_sym)(void* group, void* data, size_t size, int type, uint64_t mr_flags, void** mhandle,
                           void** gin_handle);
  fab_result (*reg_mr_sym_dmabuf)(void* group, void* data, size_t size, int type, uint64_t offset, int fd,
                                  uint64_t mr_flags, void** mhandle, void** gin_handle);
  fab_result (*dereg_mr_sym)(void* group, void* mhandle);
  fab_result (*destroy_context)(void* rma_ctx);
  fab_result (*close_group)(void* group);
  fab_result (*close_listen)(void* listen_comm);
  fab_result (*iput)(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size, uint64_t dst_off,
                     void* dst_mhandle, uint32_t rank, uint32_t opt_flags, void** request);
  fab_result (*iput_signal)(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size,
                            uint64_t dst_off, void* dst_mhandle, uint32_t rank, uint64_t signal_off,
                            void* signal_mhandle, uint64_t signal_value, uint32_t signal_op, bool strong,
                            uint32_t opt_flags, void** request);
  fab_result (*iget)(void* rma_ctx, int context, uint64_t remote_off, void* remote_mhandle, size_t size,
                     uint64_t local_off, void* local_mhandle, uint32_t rank, uint32_t opt_flags, void** request);
  fab_result (*iflush)(void* rma_ctx, int context, void* mhandle, uint32_t rank, void** request);
  fab_result (*test)(void* group, void* request, int* done);
  fab_result (*progress)(void* rma_ctx);
  fab_result (*query_last_error)(void* rma_ctx, bool* has_error);
} fab_rma_api;

/* The core functions themselves, as tables (fab_api_core.c). */
extern const fab_api fab_api_core;
extern const fab_rma_api fab_rma_api_core;

#ifdef __cplusplus
}
#endif
#endif /* FAB_API_H */
