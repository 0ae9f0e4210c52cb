/* Fixture: profiler v6 in the shape of NCCL's header: a per-version alias of
 * a shared enum, and a descriptor whose anonymous union the spec describes
 * only in part (checked by size and by its netPlugin member). */
#ifndef FIXTURE_PROFILER_V6_H
#define FIXTURE_PROFILER_V6_H

typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;

typedef struct {
  uint64_t type;                // which kind of event
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      int parentGroup;
    } coll;                     // the largest member: 88 bytes
    struct {
      ncclPid_t pid;            // from the OS header: an int on Linux
      int peer;
    } proxyOp;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
} ncclProfilerEventDescr_v6_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    void* data;
  } netPlugin;
} ncclProfilerEventStateArgs_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_v6_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
} ncclProfiler_v6_t;

#endif
