/*
 * netbench's raw mode over plain TCP sockets (--raw-socket): what NCCL's own
 * Socket transport does per message, without libfabric. One connection per
 * comm with TCP_NODELAY, each message an 8-byte length then its bytes,
 * written and read with non-blocking calls that isend, irecv and test
 * progress in order. It is the floor for any plugin over tcp on this host,
 * next to raw libfabric's tagged messages (the default raw mode): the two
 * runs' ratios say how much of a plugin's cost is libfabric's own.
 * One host only (loopback), host memory only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "nb.h"

#define SOCK_MAGIC 0x4e42534bu /* "NBSK" */
enum { SOCK_NREQ = 8192 };

typedef struct sock_comm sock_comm;

typedef struct sock_req {
  sock_comm* c;
  char* buf;
  size_t size;    /* send: the message; recv: the posted buffer */
  uint64_t len;   /* the length word: written (send) or read (recv) */
  size_t moved;   /* bytes of length word + payload moved so far */
  int send, done;
  struct sock_req* next; /* the comm's FIFO, or the free list */
} sock_req;

struct sock_comm {
  int fd;
  sock_req *head, *tail;
};

typedef struct {
  uint32_t magic, pad;
  struct sockaddr_in addr;
} sock_handle;

typedef struct {
  sock_req* reqs;
  sock_req* free_list;
} sock_state;

static int mr_token; /* what reg_mr hands out: sockets need no registration */

static void sock_check(int ok, const char* what) {
  if (!ok) nb_die("raw socket: %s: %s", what, strerror(errno));
}

static sock_comm* comm_new(int fd) {
  int one = 1;
  sock_check(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "TCP_NODELAY");
  sock_check(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
  sock_comm* c = calloc(1, sizeof(*c));
  c->fd = fd;
  return c;
}

static int s_listen(nb_xport* x, void* handle, void** lcomm) {
  (void)x;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sock_check(fd >= 0, "socket");
  sock_handle h = {.magic = SOCK_MAGIC};
  h.addr.sin_family = AF_INET;
  h.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sock_check(bind(fd, (struct sockaddr*)&h.addr, sizeof(h.addr)) == 0, "bind");
  sock_check(listen(fd, 1024) == 0, "listen");
  socklen_t len = sizeof(h.addr);
  sock_check(getsockname(fd, (struct sockaddr*)&h.addr, &len) == 0, "getsockname");
  sock_check(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
  memcpy(handle, &h, sizeof(h));
  int* l = malloc(sizeof(int));
  *l = fd;
  *lcomm = l;
  return 0;
}

/* Over loopback the kernel completes the handshake against the listener's
 * backlog, so a blocking connect returns at once. */
static int s_connect(nb_xport* x, void* handle, void** scomm) {
  (void)x;
  sock_handle h;
  memcpy(&h, handle, sizeof(h));
  if (h.magic != SOCK_MAGIC) nb_die("raw socket: the peer's handle is not a socket handle");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sock_check(fd >= 0, "socket");
  sock_check(connect(fd, (struct sockaddr*)&h.addr, sizeof(h.addr)) == 0, "connect");
  *scomm = comm_new(fd);
  return 0;
}

static int s_accept(nb_xport* x, void* lcomm, void** rcomm) {
  (void)x;
  *rcomm = NULL;
  int fd = accept(*(int*)lcomm, NULL, NULL);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    sock_check(0, "accept");
  }
  *rcomm = comm_new(fd);
  return 0;
}

static int s_close_comm(nb_xport* x, void* comm) {
  (void)x;
  sock_comm* c = comm;
  close(c->fd);
  free(c);
  return 0;
}

static int s_close_listen(nb_xport* x, void* lcomm) {
  (void)x;
  close(*(int*)lcomm);
  free(lcomm);
  return 0;
}

static int s_reg_mr(nb_xport* x, void* comm, void* buf, size_t size, void** mh) {
  (void)x, (void)comm, (void)buf, (void)size;
  *mh = &mr_token;
  return 0;
}

static int s_dereg_mr(nb_xport* x, void* comm, void* mh) {
  (void)x, (void)comm, (void)mh;
  return 0;
}

/* Moves what the socket takes of q now: 1 when q is complete. */
static int step_send(sock_req* q) {
  while (q->moved < sizeof(q->len) + q->size) {
    struct iovec iov[2];
    int n = 0;
    if (q->moved < sizeof(q->len))
      iov[n++] = (struct iovec){(char*)&q->len + q->moved, sizeof(q->len) - q->moved};
    size_t off = q->moved > sizeof(q->len) ? q->moved - sizeof(q->len) : 0;
    if (q->size > off) iov[n++] = (struct iovec){q->buf + off, q->size - off};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t r = sendmsg(q->c->fd, &m, MSG_NOSIGNAL);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    sock_check(r > 0, "send");
    q->moved += (size_t)r;
  }
  return 1;
}

static int step_recv(sock_req* q) {
  for (;;) {
    size_t want;
    char* at;
    if (q->moved < sizeof(q->len)) {
      at = (char*)&q->len + q->moved;
      want = sizeof(q->len) - q->moved;
    } else {
      if (q->len > q->size) nb_die("raw socket: a %llu-byte message for a %zu-byte receive", (unsigned long long)q->len, q->size);
      size_t off = q->moved - sizeof(q->len);
      if (off == q->len) return 1;
      at = q->buf + off;
      want = q->len - off;
    }
    ssize_t r = recv(q->c->fd, at, want, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (r == 0) nb_die("raw socket: the peer closed the connection");
    sock_check(r > 0, "recv");
    q->moved += (size_t)r;
  }
}

/* Moves the comm's requests, oldest first, as far as the socket allows. */
static void progress(sock_comm* c) {
  while (c->head) {
    sock_req* q = c->head;
    if (!(q->send ? step_send(q) : step_recv(q))) return;
    q->done = 1;
    c->head = q->next;
    if (!c->head) c->tail = NULL;
  }
}

static int post(nb_xport* x, sock_comm* c, void* buf, size_t size, int send, void** req) {
  sock_state* s = x->priv;
  sock_req* q = s->free_list;
  if (!q) nb_die("raw socket: more than %d requests in flight", SOCK_NREQ);
  s->free_list = q->next;
  *q = (sock_req){.c = c, .buf = buf, .size = size, .len = size, .send = send};
  if (c->tail) c->tail->next = q;
  else c->head = q;
  c->tail = q;
  progress(c);
  *req = q;
  return 0;
}

static int s_isend(nb_xport* x, void* scomm, void* buf, size_t size, int tag, void* mh, void** req) {
  (void)tag, (void)mh;
  return post(x, scomm, buf, size, 1, req);
}

static int s_irecv(nb_xport* x, void* rcomm, void* buf, size_t size, int tag, void* mh, void** req) {
  (void)tag, (void)mh;
  return post(x, rcomm, buf, size, 0, req);
}

static int s_test(nb_xport* x, void* req, int* done, int* size) {
  sock_state* s = x->priv;
  sock_req* q = req;
  if (!q->done) progress(q->c);
  *done = q->done;
  if (q->done) {
    if (size) *size = (int)q->len;
    q->next = s->free_list;
    s->free_list = q;
  }
  return 0;
}

static void s_fini(nb_xport* x) {
  sock_state* s = x->priv;
  if (!s) return;
  free(s->reqs);
  free(s);
  x->priv = NULL;
}

static const nb_ops sock_ops = {
    .name = "raw",
    .listen = s_listen,
    .connect = s_connect,
    .accept = s_accept,
    .close_send = s_close_comm,
    .close_recv = s_close_comm,
    .close_listen = s_close_listen,
    .reg_mr = s_reg_mr,
    .dereg_mr = s_dereg_mr,
    .isend = s_isend,
    .irecv = s_irecv,
    .test = s_test,
    .fini = s_fini,
};

int nb_sock_open(nb_xport* x, const nb_xport_opts* o) {
  if (o->mem != NB_MEM_HOST) nb_die("--raw-socket moves host memory only");
  sock_state* s = calloc(1, sizeof(*s));
  s->reqs = calloc(SOCK_NREQ, sizeof(sock_req));
  for (int i = SOCK_NREQ - 1; i >= 0; i--) {
    s->reqs[i].next = s->free_list;
    s->free_list = &s->reqs[i];
  }
  x->ops = &sock_ops;
  x->priv = s;
  snprintf(x->desc, sizeof(x->desc),
           "raw TCP sockets on loopback (as NCCL's Socket transport: a connection per comm, TCP_NODELAY, a length "
           "word per message, non-blocking)");
  return 0;
}
