/* Unit tests of the engine's parts that need no provider: request pools, the
 * object table, handle and message encoding (corruption detection), tag
 * packing, and the registration cache (with a fake backend). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_mr.h"
#include "fab_objtab.h"
#include "fab_pool.h"
#include "fab_wire.h"
#include "unit_util.h"

/* --- pool --------------------------------------------------------------------- */

Test(pool, get_put_exhaust) {
  fab_pool p;
  cr_assert_eq(fab_pool_init(&p, 32, 100), 0);
  cr_assert_eq(p.stride % 64, 0, "objects are cache-line aligned");
  void* got[32];
  for (int i = 0; i < 32; i++) {
    got[i] = fab_pool_get(&p);
    cr_assert_not_null(got[i]);
    cr_assert(fab_pool_owns(&p, got[i]));
    for (int j = 0; j < i; j++) cr_assert_neq(got[i], got[j]);
  }
  cr_assert_null(fab_pool_get(&p), "an exhausted pool returns NULL (back-pressure)");
  cr_assert_eq(fab_pool_in_use(&p), 32);
  fab_pool_put(&p, got[7]);
  cr_assert_eq(fab_pool_get(&p), got[7]);
  for (int i = 0; i < 32; i++) fab_pool_put(&p, got[i]);
  cr_assert_eq(fab_pool_in_use(&p), 0);
  cr_assert_not(fab_pool_owns(&p, (char*)got[0] + 1), "a pointer into an object is not an object");
  int x;
  cr_assert_not(fab_pool_owns(&p, &x));
  fab_pool_fini(&p);
}

Test(pool, zero_sizes_rejected) {
  fab_pool p;
  cr_assert_neq(fab_pool_init(&p, 0, 8), 0);
  cr_assert_neq(fab_pool_init(&p, 8, 0), 0);
}

/* --- object table ----------------------------------------------------------------- */

Test(objtab, lookup_by_kind_and_staleness) {
  int a, b;
  void* ha = fab_obj_add(FAB_OBJ_SEND, &a);
  void* hb = fab_obj_add(FAB_OBJ_RECV, &b);
  cr_assert(ha && hb && ha != hb);
  cr_assert_geq((uintptr_t)ha, (uintptr_t)1 << 32, "handles never look like NULL or the 0x1 hint");
  cr_assert_eq(fab_obj_get(ha, FAB_OBJ_SEND), &a);
  cr_assert_null(fab_obj_get(ha, FAB_OBJ_RECV), "a send comm is not a recv comm");
  cr_assert_eq(fab_obj_kind_of(hb), FAB_OBJ_RECV);
  cr_assert_eq(fab_obj_remove(ha, FAB_OBJ_SEND), &a);
  cr_assert_null(fab_obj_get(ha, FAB_OBJ_SEND), "a removed handle is dead");
  cr_assert_null(fab_obj_remove(ha, FAB_OBJ_SEND), "double remove is detected");
  void* hc = fab_obj_add(FAB_OBJ_SEND, &b); /* may reuse ha's slot */
  cr_assert_null(fab_obj_get(ha, FAB_OBJ_SEND), "a reused slot does not revive the old handle");
  cr_assert_eq(fab_obj_get(hc, FAB_OBJ_SEND), &b);
  cr_assert_null(fab_obj_get(NULL, FAB_OBJ_SEND));
  cr_assert_null(fab_obj_get((void*)0x1, FAB_OBJ_SEND));
  cr_assert_null(fab_obj_get((void*)&a, FAB_OBJ_SEND), "a plain pointer is not a handle");
  cr_assert_null(fab_obj_get((void*)~(uintptr_t)0, FAB_OBJ_SEND));
  fab_obj_reset();
  cr_assert_null(fab_obj_get(hb, FAB_OBJ_RECV), "reset forgets everything");
}

Test(objtab, many) {
  enum { N = 5000 };
  void** h = malloc(N * sizeof(void*));
  static int objs[N];
  for (int i = 0; i < N; i++) cr_assert_not_null(h[i] = fab_obj_add(FAB_OBJ_MR, &objs[i]));
  for (int i = 0; i < N; i++) cr_assert_eq(fab_obj_get(h[i], FAB_OBJ_MR), &objs[i]);
  for (int i = 0; i < N; i += 2) cr_assert_eq(fab_obj_remove(h[i], FAB_OBJ_MR), &objs[i]);
  for (int i = 0; i < N; i++) cr_assert_eq(fab_obj_get(h[i], FAB_OBJ_MR), i % 2 ? &objs[i] : NULL);
  fab_obj_reset();
  free(h);
}

/* --- handle and messages ------------------------------------------------------------ */

static void make_handle(unsigned char* buf) {
  unsigned char addr[16];
  for (int i = 0; i < 16; i++) addr[i] = (unsigned char)(i * 17 + 3);
  memset(buf, 0xee, FAB_HANDLE_SIZE);
  cr_assert_eq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE, 0x1122334455667788ULL, 0xabcdef01u, addr, sizeof(addr)), 0);
}

Test(wire, handle_roundtrip) {
  unsigned char buf[FAB_HANDLE_SIZE];
  make_handle(buf);
  fab_wire_handle h;
  char why[160];
  cr_assert_eq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(h.listen_id, 0x1122334455667788ULL);
  cr_assert_eq(h.prov_hash, 0xabcdef01u);
  cr_assert_eq(h.addr_len, 16);
  cr_assert_eq(h.addr[5], 5 * 17 + 3);
  cr_assert_eq(h.addr[16], 0, "unused address bytes are zero");
}

/* Every bit of the bytes in use is checked; those after them are not read
 * (a 64-byte ABI carries only the first 64). */
Test(wire, handle_every_bit_flip_detected) {
  unsigned char buf[FAB_HANDLE_SIZE];
  make_handle(buf);
  fab_wire_handle h;
  char why[160];
  size_t used = fab_wire_handle_used(buf);
  cr_assert_eq(used, FAB_HANDLE_HEADER + 16);
  for (size_t byte = used; byte < FAB_HANDLE_SIZE; byte++) buf[byte] = (unsigned char)(byte * 31);
  cr_assert_eq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0, "bytes past the address are ignored: %s", why);
  for (int byte = 0; byte < (int)used; byte++) {
    for (int bit = 0; bit < 8; bit++) {
      buf[byte] ^= (unsigned char)(1u << bit);
      cr_assert_neq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0, "flip of byte %d bit %d accepted", byte,
                    bit);
      cr_assert_gt(strlen(why), 0);
      buf[byte] ^= (unsigned char)(1u << bit);
    }
  }
  cr_assert_eq(fab_wire_handle_decode(buf, &h, NULL, 0), 0);
}

Test(wire, handle_garbage_and_limits) {
  unsigned char buf[FAB_HANDLE_SIZE];
  fab_wire_handle h;
  char why[160];
  memset(buf, 0, sizeof(buf));
  cr_assert_neq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0);
  srand(7);
  for (int t = 0; t < 1000; t++) {
    for (int i = 0; i < FAB_HANDLE_SIZE; i++) buf[i] = (unsigned char)rand();
    cr_assert_neq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0);
  }
  unsigned char addr[FAB_ADDR_MAX + 1] = {1};
  cr_assert_neq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE, 1, 1, addr, sizeof(addr)), 0,
                "an address too long for the handle");
  cr_assert_neq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE, 1, 1, addr, 0), 0);
  cr_assert_eq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE, 1, 1, addr, FAB_ADDR_MAX), 0);
  cr_assert_eq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0, "%s", why);
  /* A 64-byte handle (Neuron v4): 40 address bytes fit, 41 do not, and
   * nothing past 64 bytes is written. */
  memset(buf, 0x5a, sizeof(buf));
  cr_assert_eq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE_V4, 1, 1, addr, FAB_HANDLE_SIZE_V4 - FAB_HANDLE_HEADER), 0);
  for (int i = FAB_HANDLE_SIZE_V4; i < FAB_HANDLE_SIZE; i++) cr_assert_eq(buf[i], 0x5a, "byte %d written", i);
  cr_assert_eq(fab_wire_handle_decode(buf, &h, why, sizeof(why)), 0, "%s", why);
  cr_assert_neq(fab_wire_handle_encode(buf, FAB_HANDLE_SIZE_V4, 1, 1, addr, FAB_HANDLE_SIZE_V4 - FAB_HANDLE_HEADER + 1),
                0, "an address too long for a 64-byte handle");
}

Test(wire, connect_and_accept_messages) {
  fab_wire_connect c, cd;
  unsigned char addr[24] = {9, 8, 7};
  char why[160];
  fab_wire_tp tp = {.comm_id = 42, .transport = 2, .len = 3, .data = {1, 2, 3}};
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 1, 0, 0);
  cr_assert_eq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(cd.tp.comm_id, 42);
  cr_assert_eq(cd.tp.transport, 2);
  cr_assert_eq(cd.tp.len, 3);
  cr_assert_eq(cd.tp.data[2], 3);
  cr_assert_eq(cd.listen_id, 77);
  cr_assert_eq(cd.connector_id, 5);
  cr_assert_eq(cd.addr_len, 24);
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c) - 1, &cd, why, sizeof(why)), 0, "short message");
  ((unsigned char*)&c)[40] ^= 4;
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "corrupted message");
  tp.len = FAB_TP_MAX + 1; /* a sealed message whose payload length overruns its buffer */
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 1, 0, 0);
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "payload length out of range");
  tp.len = 3;

  fab_wire_accept a, ad;
  fab_wire_accept_encode(&a, FAB_ACCEPT_OK, 77, 5, 123, &tp, 1, 0);
  cr_assert_eq(fab_wire_accept_decode(&a, sizeof(a), &ad, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(ad.conn_id, 123);
  cr_assert_eq(ad.tp.comm_id, 42);
  tp.len = FAB_TP_MAX + 1;
  fab_wire_accept_encode(&a, FAB_ACCEPT_OK, 77, 5, 123, &tp, 1, 0);
  cr_assert_neq(fab_wire_accept_decode(&a, sizeof(a), &ad, why, sizeof(why)), 0, "payload length out of range");
  fab_wire_accept_encode(&a, FAB_ACCEPT_OK, 77, 5, 0, NULL, 1, 0);
  cr_assert_neq(fab_wire_accept_decode(&a, sizeof(a), &ad, why, sizeof(why)), 0, "connection id 0 is invalid");
  fab_wire_accept_encode(&a, FAB_ACCEPT_NO_LISTENER, 77, 5, 0, NULL, 1, 0);
  cr_assert_eq(fab_wire_accept_decode(&a, sizeof(a), &ad, why, sizeof(why)), 0, "a refusal carries no id");
  cr_assert_neq(fab_wire_accept_decode(&a, 0, &ad, why, sizeof(why)), 0);
}

/* Window messages and the truncation notice they carry: round trip, and
 * the checks a forged one meets (operation, wrap-around, seal). */
Test(wire, window_messages_and_truncation_notice) {
  fab_wire_window w, wd;
  char why[160];
  fab_wire_window_encode(&w, FAB_NOTE_TRUNCATED, 3, 4, 5, 17, 4096, 0, 4096, 0);
  cr_assert_eq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(wd.op, FAB_NOTE_TRUNCATED);
  cr_assert_eq(wd.target_id, 3);
  cr_assert_eq(wd.id, 17);
  cr_assert_eq(wd.va, 4096);
  fab_wire_window_encode(&w, FAB_NOTE_DELIVERY_ANSWER, 3, 4, 5, UINT64_MAX, 0, 0, 0, 0);
  cr_assert_eq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(wd.id, UINT64_MAX, "a delivery answer carries its 64-bit count");
  fab_wire_window_encode(&w, FAB_NOTE_DELIVERY_ANSWER + 1, 3, 4, 5, 17, 4096, 0, 4096, 0);
  cr_assert_neq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "unknown operation");
  fab_wire_window_encode(&w, 0, 3, 4, 5, 17, 4096, 0, 4096, 0);
  cr_assert_neq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "operation 0");
  fab_wire_window_encode(&w, FAB_WINDOW_ADD, 3, 4, 5, 1, UINT64_MAX - 10, 0, 100, 7);
  cr_assert_neq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "a window that wraps around");
  fab_wire_window_encode(&w, FAB_WINDOW_ADD, 3, 4, 5, 1, 0x1000, 0, 100, 7);
  cr_assert_eq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "%s", why);
  ((unsigned char*)&w)[40] ^= 1;
  cr_assert_neq(fab_wire_window_decode(&w, sizeof(w), &wd, why, sizeof(why)), 0, "corrupted message");
  cr_assert_neq(fab_wire_window_decode(&w, sizeof(w) - 1, &wd, why, sizeof(why)), 0, "short message");
}

/* Rails: a request names its rail count and rail; rail 0's answer over
 * several rails is followed by the other rails' handles, and its length
 * must say so. */
Test(wire, rails_in_connect_and_accept) {
  fab_wire_connect c, cd;
  unsigned char addr[24] = {9, 8, 7};
  char why[160];
  fab_wire_tp tp = {.comm_id = 42, .transport = 2};
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 4, 3, 262144);
  cr_assert_eq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "%s", why);
  cr_assert(cd.rails == 4 && cd.rail == 3);
  cr_assert_eq(cd.stripe_from, 262144, "the sender's stripe threshold travels with every rail's request");
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 1, 0, 262144);
  cr_assert_eq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "%s", why);
  cr_assert_eq(cd.stripe_from, 0, "one rail never stripes");
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 2, 0, 100);
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "a threshold under 4 KiB");
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, 2, 2, 0);
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "rail 2 of 2");
  fab_wire_connect_encode(&c, 77, 5, addr, sizeof(addr), &tp, FAB_MAX_RAILS + 1, 0, 0);
  cr_assert_neq(fab_wire_connect_decode(&c, sizeof(c), &cd, why, sizeof(why)), 0, "too many rails");

  unsigned char buf[FAB_ACCEPT_MAX];
  fab_wire_accept a, ad;
  fab_wire_accept_encode(&a, FAB_ACCEPT_OK, 77, 5, 123, &tp, 3, 0);
  cr_assert_eq(fab_wire_accept_len(&a), sizeof(a) + 2 * FAB_HANDLE_SIZE);
  memcpy(buf, &a, sizeof(a));
  cr_assert_eq(fab_wire_accept_decode(buf, sizeof(a) + 2 * FAB_HANDLE_SIZE, &ad, why, sizeof(why)), 0, "%s", why);
  cr_assert(ad.rails == 3 && ad.rail == 0);
  cr_assert_neq(fab_wire_accept_decode(buf, sizeof(a) + FAB_HANDLE_SIZE, &ad, why, sizeof(why)), 0,
                "one handle short");
  cr_assert_neq(fab_wire_accept_decode(buf, sizeof(a), &ad, why, sizeof(why)), 0, "no handles");
  fab_wire_accept_encode(&a, FAB_ACCEPT_OK, 77, 5, 123, &tp, 3, 1);
  cr_assert_eq(fab_wire_accept_len(&a), sizeof(a), "rail 1's answer carries no handles");
  fab_wire_accept_encode(&a, FAB_ACCEPT_RAILS, 77, 5, 0, NULL, 3, 0);
  cr_assert_eq(fab_wire_accept_decode(&a, sizeof(a), &ad, why, sizeof(why)), 0, "a refusal carries no handles");
  cr_assert_eq(ad.rails, 3);
}

/* --- tags ------------------------------------------------------------------------- */

Test(tags, layout_from_mem_tag_format) {
  fab_tag_layout t;
  cr_assert_eq(fab_tag_layout_init(&t, 0xaaaaaaaaaaaaaaaaULL), 0);
  cr_assert_eq(t.bits, 64);
  cr_assert_eq(t.ctrl, 1ULL << 63);
  cr_assert_eq(t.answer, 1ULL << 62);
  cr_assert_eq(t.conn_max, (1u << 30) - 1);
  cr_assert_eq(fab_tag_layout_init(&t, 0), 0, "0 = provider default, all bits");
  cr_assert_eq(fab_tag_layout_init(&t, (1ULL << 48) - 1), 0);
  cr_assert_eq(t.bits, 48);
  cr_assert_eq(t.conn_max, (1u << 14) - 1);
  cr_assert_eq(t.ctrl, 1ULL << 47);
  cr_assert_neq(fab_tag_layout_init(&t, (1ULL << 40) - 1), 0, "40 bits leave too few for connection ids");
}

Test(tags, packing_never_collides) {
  const uint64_t formats[] = {0xaaaaaaaaaaaaaaaaULL, (1ULL << 48) - 1, (1ULL << 42) - 1};
  for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
    fab_tag_layout t;
    cr_assert_eq(fab_tag_layout_init(&t, formats[f]), 0);
    uint64_t valid = t.bits == 64 ? ~0ULL : (1ULL << t.bits) - 1;
    const int nccl_tags[] = {0, 1, -1, INT_MAX, INT_MIN, 12345};
    const uint32_t conns[] = {1, 2, t.conn_max};
    for (size_t i = 0; i < sizeof(conns) / sizeof(conns[0]); i++) {
      for (size_t k = 0; k < sizeof(nccl_tags) / sizeof(nccl_tags[0]); k++) {
        uint64_t tag = fab_tag_data(conns[i], nccl_tags[k]);
        cr_assert_eq(tag & ~valid, 0, "data tag uses bits the provider lacks");
        cr_assert_eq(tag & t.ctrl, 0, "data tag has the control bit");
        cr_assert_eq(tag & t.answer, 0, "data tag has the answer bit");
        cr_assert_eq((uint32_t)tag, (uint32_t)nccl_tags[k], "NCCL's tag in the low 32 bits");
        cr_assert_eq(tag >> 32, conns[i], "connection id above it");
      }
    }
    cr_assert_neq(fab_tag_accept(&t, 0) & t.ctrl, 0, "an answer tag has the control bit");
    cr_assert_eq(fab_tag_accept(&t, 0xffffffffu) & ~valid, 0);
    cr_assert_neq(fab_tag_data(1, 5), fab_tag_data(2, 5), "two connections never share a tag");
  }
}

/* --- registration cache (fake backend) -------------------------------------------- */

static int g_regs, g_closes;
static int fake_reg(void* arg, fab_mr_entry* e) {
  (void)arg;
  g_regs++;
  e->desc = (void*)(e->base ^ 0x5a5a);
  return 0;
}
static int fail_reg(void* arg, fab_mr_entry* e) {
  (void)arg;
  (void)e;
  return -FI_ENOMEM;
}
static void fake_close(void* arg, fab_mr_entry* e) {
  (void)arg;
  (void)e;
  g_closes++;
}

Test(mr_cache, sub_ranges_hit) {
  g_regs = g_closes = 0;
  long ps = sysconf(_SC_PAGESIZE);
  fab_mr_cache* c = fab_mr_cache_create();
  char* buf = aligned_alloc((size_t)ps, 64 * (size_t)ps);
  int err;
  fab_mr_entry* big =
      fab_mr_cache_acquire(c, (uintptr_t)buf + 5, 64 * (size_t)ps - 10, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
  cr_assert_not_null(big);
  cr_assert_eq(big->base, (uintptr_t)buf, "page aligned down");
  cr_assert_eq(big->len, 64 * (size_t)ps, "page aligned up");
  cr_assert_eq(g_regs, 1);
  for (int i = 0; i < 100; i++) {
    fab_mr_entry* sub =
        fab_mr_cache_acquire(c, (uintptr_t)buf + (size_t)i * 97, 1000, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
    cr_assert_eq(sub, big, "a sub-range shares the registration");
  }
  cr_assert_eq(g_regs, 1, "no new registration for sub-ranges");
  cr_assert_eq(big->refs, 101);
  fab_mr_entry* cuda = fab_mr_cache_acquire(c, (uintptr_t)buf, 100, FAB_PTR_CUDA, 0, NULL, fake_reg, NULL, &err);
  cr_assert_neq(cuda, big, "another memory type is another registration");
  cr_assert_eq(g_regs, 2);
  /* FI_MR_ENDPOINT: a registration serves one endpoint; another endpoint's is another registration */
  const fab_endpoint* ep_a = (const fab_endpoint*)(uintptr_t)0x1000;
  fab_mr_entry* bound = fab_mr_cache_acquire(c, (uintptr_t)buf, 100, FAB_PTR_HOST, -1, ep_a, fake_reg, NULL, &err);
  cr_assert(bound && bound != big && bound->owner == ep_a);
  cr_assert_eq(fab_mr_cache_acquire(c, (uintptr_t)buf + 8, 8, FAB_PTR_HOST, -1, ep_a, fake_reg, NULL, &err), bound,
               "the same endpoint shares it");
  cr_assert_eq(g_regs, 3);
  fab_mr_cache_release(c, bound, fake_close, NULL);
  fab_mr_cache_release(c, bound, fake_close, NULL);
  g_regs = 2, g_closes = 0;
  for (int i = 0; i < 100; i++) fab_mr_cache_release(c, big, fake_close, NULL);
  cr_assert_eq(g_closes, 0, "still referenced");
  fab_mr_cache_release(c, big, fake_close, NULL);
  cr_assert_eq(g_closes, 1, "the last release closes the registration");
  fab_mr_entry* again = fab_mr_cache_acquire(c, (uintptr_t)buf + 100, 10, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
  cr_assert_eq(g_regs, 3, "released ranges are registered anew");
  fab_mr_cache_release(c, again, fake_close, NULL);
  fab_mr_cache_release(c, cuda, fake_close, NULL);
  cr_assert_eq(c->n, 0);
  fab_mr_cache_destroy(c, fake_close, NULL);
  free(buf);
}

Test(mr_cache, overlapping_and_many) {
  g_regs = g_closes = 0;
  const uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t base = 0x100000000ULL; /* never dereferenced */
  fab_mr_cache* c = fab_mr_cache_create();
  int err;
  fab_mr_entry* e[64];
  for (int i = 0; i < 64; i++) {
    e[i] = fab_mr_cache_acquire(c, base + (uintptr_t)i * 4 * ps, 2 * ps, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
    cr_assert_not_null(e[i]);
  }
  cr_assert_eq(g_regs, 64);
  /* A range across two registrations needs its own. */
  fab_mr_entry* span = fab_mr_cache_acquire(c, base + ps, 4 * ps, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
  cr_assert_eq(g_regs, 65);
  /* A range inside the big one now hits it (found by the backward scan). */
  fab_mr_entry* in = fab_mr_cache_acquire(c, base + 4 * ps + 10, 100, FAB_PTR_HOST, -1, NULL, fake_reg, NULL, &err);
  cr_assert(in == span || in == e[1]);
  cr_assert_eq(g_regs, 65);
  for (int i = 0; i < 64; i++) {
    fab_mr_entry* hit = fab_mr_cache_acquire(c, base + (uintptr_t)i * 4 * ps + ps, ps, FAB_PTR_HOST, -1, NULL, fake_reg,
                                             NULL, &err);
    cr_assert(hit == e[i] || hit == span, "page %d missed", i);
    fab_mr_cache_release(c, hit, fake_close, NULL);
  }
  cr_assert_eq(g_regs, 65);
  fab_mr_cache_release(c, in, fake_close, NULL);
  fab_mr_cache_release(c, span, fake_close, NULL);
  for (int i = 0; i < 64; i++) fab_mr_cache_release(c, e[i], fake_close, NULL);
  cr_assert_eq(g_closes, 65);
  cr_assert_eq(c->n, 0);
  fab_mr_cache_destroy(c, fake_close, NULL);
}

Test(mr_cache, failed_registration) {
  fab_mr_cache* c = fab_mr_cache_create();
  int err = 0;
  cr_assert_null(fab_mr_cache_acquire(c, 0x200000000ULL, 10, FAB_PTR_HOST, -1, NULL, fail_reg, NULL, &err));
  cr_assert_eq(err, -FI_ENOMEM);
  cr_assert_eq(c->n, 0, "a failed registration is not cached");
  fab_mr_cache_destroy(c, fake_close, NULL);
}

/* --- rails' polling threads and small requests ------------------------------------ */

#include "fab_req.h"

/* Waits up to ms for the polling thread's sleep state to read `want`. */
static int helper_reaches(fab_endpoint* ep, int want, int ms) {
  for (int64_t end = fab_now_ms() + ms; fab_now_ms() < end; usleep(1000))
    if (atomic_load(&ep->helper_asleep) == want) return 1;
  return atomic_load(&ep->helper_asleep) == want;
}

/* A rail's polling thread sleeps while only small requests are live (the
 * runtime's tests read the CQ then), a small one handed out leaves it
 * asleep, and a large one wakes it. The endpoint has no CQ: the thread
 * never reads it while only small requests are live, and once woken it
 * finds the endpoint failed and ends. */
Test(rails, thread_sleeps_while_only_small_requests_live) {
  fab_g.params.rail_small_max = 65536;
  static fab_endpoint ep;
  static fab_comm c;
  static fab_req small, small2, large;
  pthread_mutex_init(&ep.helper_lock, NULL);
  atomic_store(&ep.cq_gated, 1);
  c.ep = &ep;
  c.helped = 1;
  small.comm = small2.comm = large.comm = &c;
  small.busy = (uint8_t)fab_ep_helper_hold(&ep);
  fab_req_sized(&small, 8);
  cr_assert_eq(fab_ep_helper_acquire(&ep), 0, "the thread started");
  cr_assert(helper_reaches(&ep, FAB_HELPER_ASLEEP_SMALL, 500), /* its idle time (10 ms) many times over */
            "only a small request live: the thread sleeps (state %d)", atomic_load(&ep.helper_asleep));
  small2.busy = (uint8_t)fab_ep_helper_hold(&ep);
  fab_req_sized(&small2, 4096);
  usleep(2000);
  cr_assert_eq(atomic_load(&ep.helper_asleep), FAB_HELPER_ASLEEP_SMALL, "another small one leaves it asleep");
  atomic_store(&ep.failed, FAB_ERR_INTERNAL); /* what it finds once awake: it ends */
  large.busy = (uint8_t)fab_ep_helper_hold(&ep);
  fab_req_sized(&large, 65537);
  cr_assert_eq(atomic_load(&ep.helper_asleep), FAB_HELPER_AWAKE, "a large one wakes it");
  fab_ep_helper_release(&ep); /* joins it */
  fab_req_let_go(&large);
  fab_req_let_go(&small2);
  fab_req_let_go(&small);
  cr_assert_eq(atomic_load(&ep.helper_busy), 0);
  pthread_mutex_destroy(&ep.helper_lock);
}

/* FABRIC_RAIL_SMALL_MAX: while only small requests are live on an endpoint
 * whose thread polls, the comms' tests read the CQ themselves; a large one
 * (or a split receive) leaves it to the thread again until it is gone. */
Test(rails, small_requests_leave_the_cq_to_tests) {
  fab_g.params.rail_small_max = 65536;
  static fab_endpoint ep;
  static fab_comm c;
  static fab_req small, large;
  atomic_store(&ep.cq_gated, 1); /* a thread runs */
  c.ep = &ep;
  c.helped = 1;
  small.comm = large.comm = &c;
  small.busy = (uint8_t)fab_ep_helper_hold(&ep);
  large.busy = (uint8_t)fab_ep_helper_hold(&ep);
  cr_assert(small.busy && large.busy, "counted where the thread runs");
  fab_req_sized(&small, 65536);
  cr_assert_eq(atomic_load(&ep.helper_large), 0, "64 KiB is small");
  int polls = 0;
  for (int i = 0; i < 128; i++) polls += fab_comm_test_polls(&c);
  cr_assert_eq(polls, 128, "only small requests live: every test polls");
  fab_req_sized(&large, 65537);
  cr_assert_eq(atomic_load(&ep.helper_large), 1);
  polls = 0;
  for (int i = 0; i < 128; i++) polls += fab_comm_test_polls(&c);
  cr_assert_eq(polls, 2, "a large request live: one test in %d polls, not %d in 128", FAB_HELPED_POLL_EVERY, polls);
  fab_req_let_go(&large);
  cr_assert_eq(atomic_load(&ep.helper_large), 0, "the large one gone");
  cr_assert_eq(fab_comm_test_polls(&c), 1);
  fab_req_let_go(&small);
  cr_assert_eq(atomic_load(&ep.helper_busy), 0, "every request given back");
  fab_g.params.rail_small_max = 0; /* 0: every request with bytes is large */
  small.busy = (uint8_t)fab_ep_helper_hold(&ep);
  fab_req_sized(&small, 1);
  cr_assert_eq(atomic_load(&ep.helper_large), 1);
  fab_req_let_go(&small);
}
