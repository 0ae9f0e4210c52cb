/*
 * Registered buffers of our own (core/fabric/fab_remote.h): a transport's mailboxes and
 * rings, the ones retired while a peer may still write into them, and the
 * endpoint's bounce pool.
 *
 * The bounce pool serves small writes whose source may be reused at once
 * where the provider cannot inject them (libfabric 2.x's shm entry for GPU
 * memory has an inject size of 0; a NIC's may be smaller than a control
 * record). The bytes are copied into a registered slot and written from there
 * with the slot's descriptor; the slot goes back when the write completes, and
 * the caller's operation completes then, as it would after an inline write.
 * The pool grows by registered chunks of FAB_BOUNCE_CHUNK slots while writes
 * are outstanding, up to FAB_BOUNCE_CHUNKS chunks; beyond that a write answers
 * -FI_EAGAIN (retry after progress), which every caller of an inline write
 * already handles. Chunks are freed with the endpoint, after it is closed.
 */
#include <stdlib.h>
#include <string.h>

#include "fab_remote.h"

int fab_remote_buf_reg(fab_endpoint* ep, void* buf, size_t len, uint64_t access, fab_remote_buf* out) {
  fab_device* dev = ep->dev;
  fab_domain* dom = dev->dom;
  uint64_t key = dev->prov_key ? 0 : atomic_fetch_add(&dom->next_key, 1);
  out->mr = NULL;
  int rc = fi_mr_reg(dom->domain, buf, len, access, 0, key, 0, &out->mr, NULL);
  if (rc == 0) rc = fab_ep_bind_mr(ep, out->mr);
  if (rc != 0) {
    if (out->mr) fi_close(&out->mr->fid);
    out->mr = NULL;
    return rc;
  }
  out->desc = fi_mr_desc(out->mr);
  out->win.addr = dev->virt_addr ? (uint64_t)(uintptr_t)buf : 0;
  out->win.len = len;
  out->win.key = fi_mr_key(out->mr);
  return 0;
}

void fab_remote_buf_dereg(fab_remote_buf* b) {
  if (b->mr) fi_close(&b->mr->fid);
  b->mr = NULL;
}

typedef struct retired_buf {
  fab_list node;
  fab_remote_buf buf;
  void* mem;
  int64_t since_ms;
} retired_buf;

void fab_remote_retired_free(fab_endpoint* ep, int all) {
  int64_t now = fab_now_ms();
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->retired) {
    retired_buf* r = FAB_CONTAINER_OF(it, retired_buf, node);
    if (!all && now - r->since_ms < FAB_RETIRE_GRACE_MS) continue;
    fab_list_del(&r->node);
    fab_remote_buf_dereg(&r->buf);
    free(r->mem);
    free(r);
  }
}

void fab_remote_buf_retire(fab_endpoint* ep, fab_remote_buf* b, void* mem) {
  fab_remote_retired_free(ep, 0); /* the old ones go as new ones come: bounded by closes per grace period */
  retired_buf* r = malloc(sizeof(*r));
  if (!r) { /* out of memory: keep the registration and the memory for good rather than risk a late write */
    FAB_INFO(FAB_SUBSYS_NET, "out of memory retiring a buffer on %s; it stays allocated", ep->dev->name);
    return;
  }
  r->buf = *b;
  r->mem = mem;
  r->since_ms = fab_now_ms();
  fab_list_push(&ep->retired, &r->node);
}

/* --- the bounce pool ------------------------------------------------------ */

enum { FAB_BOUNCE_CHUNK = 256, FAB_BOUNCE_CHUNKS = 64 };

struct fab_bounce_chunk {
  struct fab_bounce_chunk* next;
  fab_remote_buf reg;
  fab_bounce_slot slots[FAB_BOUNCE_CHUNK];
};

struct fab_bounce_pool {
  pthread_mutex_t lock; /* its own: inline writes are posted with and without the endpoint lock */
  fab_bounce_slot* free_slots;
  struct fab_bounce_chunk* chunks;
  int nchunks;
  int told; /* the pool reached its cap once (said once, at INFO) */
};

static void slot_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);

/* Registers one more chunk and puts its slots on the free list; pool lock held. */
static int grow(fab_endpoint* ep, fab_bounce_pool* pool) {
  struct fab_bounce_chunk* ch = calloc(1, sizeof(*ch));
  if (!ch) return -FI_ENOMEM;
  int rc = fab_remote_buf_reg(ep, ch, sizeof(*ch), FI_WRITE, &ch->reg);
  if (rc != 0) {
    free(ch);
    return rc;
  }
  for (int i = 0; i < FAB_BOUNCE_CHUNK; i++) {
    fab_bounce_slot* s = &ch->slots[i];
    s->desc = ch->reg.desc;
    s->next_free = pool->free_slots;
    pool->free_slots = s;
  }
  ch->next = pool->chunks;
  pool->chunks = ch;
  pool->nchunks++;
  return 0;
}

static fab_bounce_pool* pool_of(fab_endpoint* ep) {
  fab_bounce_pool* pool = atomic_load_explicit(&ep->bounce, memory_order_acquire);
  if (FAB_LIKELY(pool != NULL)) return pool;
  fab_bounce_pool* fresh = calloc(1, sizeof(*fresh));
  if (!fresh) return NULL;
  pthread_mutex_init(&fresh->lock, NULL);
  if (atomic_compare_exchange_strong(&ep->bounce, &pool, fresh)) return fresh;
  pthread_mutex_destroy(&fresh->lock); /* another thread made it first */
  free(fresh);
  return pool;
}

void fab_bounce_give_back(fab_endpoint* ep, fab_bounce_slot* s) {
  fab_bounce_pool* pool = atomic_load_explicit(&ep->bounce, memory_order_acquire);
  pthread_mutex_lock(&pool->lock);
  s->next_free = pool->free_slots;
  pool->free_slots = s;
  pthread_mutex_unlock(&pool->lock);
}

static void slot_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_bounce_slot* s = (fab_bounce_slot*)op;
  fab_op* user = s->user;
  fab_bounce_give_back(op->owner, s);
  user->fn(user, done, err);
}

fab_bounce_slot* fab_bounce_take(fab_endpoint* ep, const void* buf, size_t len, fab_op* op, ssize_t* rc) {
  if (FAB_UNLIKELY(len > FAB_BOUNCE_BYTES)) {
    *rc = -FI_EMSGSIZE;
    return NULL;
  }
  fab_bounce_pool* pool = pool_of(ep);
  if (!pool) {
    *rc = -FI_ENOMEM;
    return NULL;
  }
  pthread_mutex_lock(&pool->lock);
  if (!pool->free_slots && pool->nchunks < FAB_BOUNCE_CHUNKS) {
    int g = grow(ep, pool);
    if (g != 0) {
      pthread_mutex_unlock(&pool->lock);
      FAB_WARN("registering %zu bytes of bounce slots for small writes on %s failed: %s",
               sizeof(struct fab_bounce_chunk), ep->dev->name, fi_strerror(-g));
      *rc = g;
      return NULL;
    }
  }
  fab_bounce_slot* s = pool->free_slots;
  if (s) pool->free_slots = s->next_free;
  else if (!pool->told) {
    pool->told = 1;
    FAB_INFO(FAB_SUBSYS_NET, "%d small writes outstanding on %s: later ones wait for earlier ones to complete",
             FAB_BOUNCE_CHUNK * FAB_BOUNCE_CHUNKS, ep->dev->name);
  }
  pthread_mutex_unlock(&pool->lock);
  if (!s) {
    *rc = -FI_EAGAIN;
    return NULL;
  }
  if (len) memcpy(s->bytes, buf, len);
  s->user = op;
  s->op.fn = slot_done;
  s->op.owner = ep;
  s->op.index = 0;
  s->op.unlocked = op->unlocked; /* the caller's handler runs where it would have */
  return s;
}

void fab_bounce_free(fab_endpoint* ep) {
  fab_bounce_pool* pool = atomic_exchange(&ep->bounce, NULL);
  if (!pool) return;
  for (struct fab_bounce_chunk *ch = pool->chunks, *next; ch; ch = next) {
    next = ch->next;
    fab_remote_buf_dereg(&ch->reg);
    free(ch);
  }
  pthread_mutex_destroy(&pool->lock);
  free(pool);
}
