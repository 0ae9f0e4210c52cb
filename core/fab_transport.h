/*
 * The transport interface: how data moves once a connection exists. The core
 * owns devices, endpoints, the handshake, memory registration and comm
 * lifetime; a transport owns the data operations. A device's transport is
 * chosen at discovery from the provider's capability bits (never its name).
 *
 * The core validates every argument before calling a transport: comms are
 * live and of the right kind, n is in range, sizes fit max_bytes, memory
 * handles are resolved to descriptors. Transports see only valid input.
 */
#ifndef FAB_TRANSPORT_H
#define FAB_TRANSPORT_H

#include "fab_engine.h"
#include "fab_mr.h"

struct fab_transport_ops {
  const char* name;
  /* capability bits the transport needs in addition to the discovery hints */
  uint64_t extra_caps;
  uint32_t send_reqs, recv_reqs; /* pool size per comm */
  uint32_t send_subs, recv_subs; /* sub-operations per request */

  /* Once per pooled request, when a comm is created. */
  void (*init_req)(fab_comm* c, fab_req* r, uint32_t nsubs);
  fab_result (*isend)(fab_comm* c, void* data, size_t size, int tag, void* desc, void** request);
  fab_result (*irecv)(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, void** descs,
                      void** request);
  /* mrs[i] may be NULL (host memory). */
  fab_result (*iflush)(fab_comm* c, int n, void** data, const int* sizes, fab_mr** mrs, void** request);
  fab_result (*test)(fab_req* r, int* done, int* sizes);
  /* Close: stop what can be stopped (cancel posted receives). ep lock held. */
  void (*cancel)(fab_comm* c);
};

/* The transport for a provider entry, or NULL when none can run on it. */
const fab_transport_ops* fab_transport_select(const struct fi_info* info);

extern const fab_transport_ops fab_sendrecv_ops;

#endif /* FAB_TRANSPORT_H */
