/*
 * The data-path entry points: validate what the runtime passed (cheaply: a
 * handle lookup and a few compares), resolve memory handles to descriptors,
 * then hand over to the comm's transport.
 */
#include <stdint.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_prof.h"
#include "fab_mr.h"
#include "fab_pwin.h"
#include "fab_rails.h"
#include "fab_req.h"
#include "fab_transport.h"

#ifdef FI_MR_DMABUF
#define DMABUF_WHY ""
#else
#define DMABUF_WHY ": this build's libfabric has no FI_MR_DMABUF"
#endif

static __attribute__((noinline, cold)) fab_comm* comm_warn(void* handle, fab_obj_kind kind, const char* fn) {
  fab_obj_kind k = fab_obj_kind_of(handle);
  FAB_WARN("%s: %p is %s%s, not a live %s", fn, handle, k ? "a " : "",
           k ? fab_obj_kind_name(k) : "unknown or already closed", fab_obj_kind_name(kind));
  return NULL;
}

/* Inline: it is on every isend/irecv; the WARN path stays out of line. */
static inline fab_comm* comm_or_warn(void* handle, fab_obj_kind kind, const char* fn) {
  fab_comm* c = fab_obj_get(handle, kind);
  if (FAB_LIKELY(c != NULL)) return c;
  return comm_warn(handle, kind, fn);
}

/* A comm over several rails (fab_rails.h) is another kind of handle: the
 * single-rail path looks for it only after its own lookup failed. */
static inline int is_rails(void* handle, fab_obj_kind kind) { return fab_obj_kind_of(handle) == kind; }


/* A range no registration can cover: the address space ends before it does. */
static fab_result reg_range_check(const void* data, size_t size, const char* fn) {
  if (size <= (size_t)PTRDIFF_MAX && (uintptr_t)data <= UINTPTR_MAX - size) return FAB_OK;
  FAB_WARN("%s: %zu bytes at %p run past the end of the address space; register the buffer's real size", fn, size,
           data);
  return FAB_ERR_INVALID_ARG;
}

fab_result fab_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (!mhandle) return fab_bad_argument("regMr", "mhandle", 0, "a non-NULL pointer");
  *mhandle = NULL;
  fab_obj_kind k = fab_obj_kind_of(comm);
  int rails = k == FAB_OBJ_RAILS_SEND || k == FAB_OBJ_RAILS_RECV;
  if (k != FAB_OBJ_SEND && k != FAB_OBJ_RECV && !rails) {
    FAB_WARN("regMr: %p is not a live send or recv comm", comm);
    return FAB_ERR_INTERNAL;
  }
  if (!data) return fab_bad_argument("regMr", "data", 0, "a non-NULL address");
  if (reg_range_check(data, size, "regMr") != FAB_OK) return FAB_ERR_INVALID_ARG;
  if (rails) return fab_rails_reg_mr(comm, data, size, type, 0, -1, mhandle, "regMr");
  return fab_mr_register(fab_obj_get(comm, k), data, size, type, 0, -1, mhandle, "regMr");
}

fab_result fab_reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mhandle) {
  if (!mhandle) return fab_bad_argument("regMrDmaBuf", "mhandle", 0, "a non-NULL pointer");
  *mhandle = NULL;
  fab_obj_kind k = fab_obj_kind_of(comm);
  if (k == FAB_OBJ_RAILS_SEND || k == FAB_OBJ_RAILS_RECV) {
    if (reg_range_check(data, size, "regMrDmaBuf") != FAB_OK) return FAB_ERR_INVALID_ARG;
    fab_rails_comm* rc = fab_obj_get(comm, k);
    if (rc && !(rc->dev->props.ptr_support & FAB_PTR_DMABUF)) {
      FAB_WARN("regMrDmaBuf: device %s does not support dma-buf registration (not advertised in ptrSupport%s); use "
               "regMr", rc->dev->name, DMABUF_WHY);
      return FAB_ERR_INTERNAL;
    }
    return fab_rails_reg_mr(comm, data, size, type, fd < 0 ? 0 : offset, fd, mhandle, "regMrDmaBuf");
  }
  if (k != FAB_OBJ_SEND && k != FAB_OBJ_RECV) {
    FAB_WARN("regMrDmaBuf: %p is not a live send or recv comm", comm);
    return FAB_ERR_INTERNAL;
  }
  fab_comm* c = fab_obj_get(comm, k);
  if (reg_range_check(data, size, "regMrDmaBuf") != FAB_OK) return FAB_ERR_INVALID_ARG;
  if (!(c->dev->props.ptr_support & FAB_PTR_DMABUF)) {
    FAB_WARN("regMrDmaBuf: device %s does not support dma-buf registration (not advertised in ptrSupport%s); use "
             "regMr", c->dev->name, DMABUF_WHY);
    return FAB_ERR_INTERNAL;
  }
  if (fd < 0) return fab_mr_register(c, data, size, type, 0, -1, mhandle, "regMrDmaBuf");
  return fab_mr_register(c, data, size, type, offset, fd, mhandle, "regMrDmaBuf");
}

fab_result fab_dereg_mr(void* comm, void* mhandle) {
  (void)comm; /* the handle knows its domain; NCCL may deregister through either comm */
  if (FAB_UNLIKELY(is_rails(mhandle, FAB_OBJ_RAILS_MR))) return fab_rails_dereg_mr(mhandle);
  return fab_mr_deregister(mhandle);
}

fab_result fab_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                     void** request) {
  if (FAB_UNLIKELY(!request)) return fab_bad_argument("isend", "request", 0, "a non-NULL pointer");
  *request = NULL;
  fab_comm* c = fab_obj_get(send_comm, FAB_OBJ_SEND);
  if (FAB_UNLIKELY(!c)) {
    if (is_rails(send_comm, FAB_OBJ_RAILS_SEND)) return fab_rails_isend(send_comm, data, size, tag, mhandle, phandle, request);
    comm_warn(send_comm, FAB_OBJ_SEND, "isend");
    return FAB_ERR_INTERNAL;
  }
  fab_result rc = fab_buffer_ok(c->dev->name, c->max_bytes, -1, data, size, mhandle);
  if (FAB_UNLIKELY(rc != FAB_OK)) return rc;
  if (FAB_UNLIKELY(c->error != FAB_OK)) return fab_comm_failed(c, "isend");
  fab_mr* mr;
  rc = fab_mr_resolve(c, mhandle, data, size, "isend", &mr);
  if (FAB_UNLIKELY(rc != FAB_OK)) return rc;
  rc = c->ops->isend(c, data, size, tag, mr, request);
  if (FAB_UNLIKELY(rc == FAB_OK && !*request)) return fab_comm_not_now(c, "isend");
  if (FAB_UNLIKELY(phandle != NULL) && rc == FAB_OK && fab_prof_wanted(fab_comm_ext_get(c, FAB_EXT_PROF))) fab_prof_posted(*request, &phandle, &size, &tag);
  return rc;
}

fab_result fab_irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
                     void** phandles, void** request) {
  if (FAB_UNLIKELY(!request)) return fab_bad_argument("irecv", "request", 0, "a non-NULL pointer");
  *request = NULL; /* overwrites NCCL's 0x1 hint too */
  fab_comm* c = fab_obj_get(recv_comm, FAB_OBJ_RECV);
  if (FAB_UNLIKELY(!c)) {
    if (is_rails(recv_comm, FAB_OBJ_RAILS_RECV))
      return fab_rails_irecv(recv_comm, n, data, sizes, tags, mhandles, phandles, request);
    comm_warn(recv_comm, FAB_OBJ_RECV, "irecv");
    return FAB_ERR_INTERNAL;
  }
  if (FAB_UNLIKELY(n < 1 || n > FAB_MAX_RECVS)) return fab_bad_argument("irecv", "n", n, "1..8 (maxRecvs)");
  if (FAB_UNLIKELY(!data || !sizes || !tags)) return fab_bad_argument("irecv", "data/sizes/tags", 0, "arrays of n");
  if (FAB_UNLIKELY(c->error != FAB_OK)) return fab_comm_failed(c, "irecv");
  fab_mr* mrs[FAB_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    void* mh = mhandles ? mhandles[i] : NULL;
    fab_result rc = fab_buffer_ok(c->dev->name, c->max_bytes, i, data[i], sizes[i], mh);
    if (FAB_UNLIKELY(rc != FAB_OK)) return rc;
    rc = fab_mr_resolve(c, mh, data[i], sizes[i], "irecv", &mrs[i]);
    if (FAB_UNLIKELY(rc != FAB_OK)) return rc;
  }
  fab_result rc = c->ops->irecv(c, n, data, sizes, tags, mrs, request);
  if (FAB_UNLIKELY(rc == FAB_OK && !*request)) return fab_comm_not_now(c, "irecv");
  if (FAB_UNLIKELY(phandles != NULL) && rc == FAB_OK && fab_prof_wanted(fab_comm_ext_get(c, FAB_EXT_PROF))) fab_prof_posted(*request, phandles, sizes, tags);
  return rc;
}

fab_result fab_iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request) {
  if (!request) return fab_bad_argument("iflush", "request", 0, "a non-NULL pointer");
  *request = NULL;
  if (is_rails(recv_comm, FAB_OBJ_RAILS_RECV)) return fab_rails_iflush(recv_comm, n, data, sizes, mhandles, request);
  fab_comm* c = comm_or_warn(recv_comm, FAB_OBJ_RECV, "iflush");
  if (!c) return FAB_ERR_INTERNAL;
  if (n < 1 || n > FAB_MAX_RECVS) return fab_bad_argument("iflush", "n", n, "1..8 (maxRecvs)");
  if (!data || !sizes) return fab_bad_argument("iflush", "data/sizes", 0, "arrays of n");
  fab_mr* mrs[FAB_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return fab_bad_argument("iflush", "sizes[i]", sizes[i], ">= 0");
    fab_result rc = fab_mr_resolve(c, mhandles ? mhandles[i] : NULL, data[i], (size_t)sizes[i], "iflush", &mrs[i]);
    if (rc != FAB_OK) return rc;
  }
  return c->ops->iflush(c, n, data, sizes, mrs, request);
}

fab_result fab_test(void* request, int* done, int* sizes) {
  if (FAB_UNLIKELY(!done)) return fab_bad_argument("test", "done", 0, "a non-NULL pointer");
  *done = 0;
  /* Every kind (a comm's send or receive, a Neuron iwrite or iread, a
   * grouped receive or a split send over several rails) starts with the
   * request header; the pointer is checked before anything is read. */
  fab_req_head* h = fab_req_head_check(request, FAB_REQ_API_NET, "test");
  if (FAB_UNLIKELY(!h)) return FAB_ERR_INTERNAL;
  return h->kind->test(h, done, sizes);
}
