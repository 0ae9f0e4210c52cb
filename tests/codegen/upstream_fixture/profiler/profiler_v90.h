/* Fixture: a hypothetical profiler v90 (not NCCL's): the descriptor's anonymous union changes size (its
 * largest member has two fields more than v6's, fewer than NCCL's v7), the state arguments stay as they
 * were, and the state enum gets a per-version name. */
#ifndef FIXTURE_PROFILER_V90_H
#define FIXTURE_PROFILER_V90_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v90_t;

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      void const* sendBuff;     // const after the type, as NCCL writes it
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      int parentGroup;
      const char* variant;
      uint64_t tag;
    } coll;
    struct {
      ncclPid_t pid;
      int peer;
    } proxyOp;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v90_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    void* data;
  } netPlugin;
} ncclProfilerEventStateArgs_v90_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v90_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v90_t eState,
                                   ncclProfilerEventStateArgs_v90_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v90_t;

#endif
