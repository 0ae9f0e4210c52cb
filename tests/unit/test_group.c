/*
 * The target side of one-sided groups (core/onesided/fab_group_ops.c) against forged
 * input, in one process: what lands is handed to fab_group_target_landed as
 * the rdma transport would, in any order a provider may deliver it.
 *  - a signal applies only once every put its source sent before it has
 *    landed, whatever order the completions come in (the providers on this
 *    machine deliver in order, so the two-process tests cannot see this);
 *  - records apply in their source's order, each once;
 *  - a record or acknowledgement a peer could forge (bad checksum, another
 *    group's token, a slot it does not own, a window not registered, an
 *    offset outside it, an unknown operation, an acknowledgement of signals
 *    never sent) fails the group with one WARN and writes nothing.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"
#include "fab_log.h"
#include "unit_util.h"

enum { TOKEN = 0x5a5a1234 };

typedef struct fixture {
  fab_group g;
  fab_group_peer peers[2];
  fab_comm* rc;
  fab_group_win win;
  fab_group_win* wins[1];
  uint64_t words[8];
  fab_group_sig ring[FAB_GROUP_RING + 2];
} fixture;

static fixture* fx;

static void setup(void) {
  fab_log_set_logger(ut_logger);
  ut_reset_warns();
  fx = calloc(1, sizeof(*fx));
  fx->rc = calloc(1, sizeof(fab_comm));
  fab_group* g = &fx->g;
  g->nranks = 2;
  g->rank = 0;
  g->peers = fx->peers;
  g->wins = fx->wins;
  g->nwins = 1;
  fx->win = (fab_group_win){.id = 0, .group = g, .base = (uintptr_t)fx->words, .len = sizeof fx->words};
  fx->wins[0] = &fx->win;
  fab_group_peer* p = &fx->peers[1];
  p->group = g;
  p->rank = 1;
  p->token = TOKEN;
  p->ring_mem = fx->ring;
  p->put_seen = calloc(FAB_GROUP_PUT_WINDOW / 64, sizeof(uint64_t));
  p->hook = (fab_onesided_hook){.landed = fab_group_target_landed, .arg = p};
  fab_comm_ext_set(fx->rc, FAB_EXT_ONESIDED, &p->hook, NULL);
}

static void teardown(void) {
  free(fx->peers[1].put_seen);
  free(fx->rc);
  free(fx);
}

TestSuite(group, .init = setup, .fini = teardown);

/* The peer writes record seq into its slot (what its RDMA write places). */
static void place(uint32_t seq, uint64_t puts_before, uint64_t offset, uint64_t value, uint32_t op) {
  fab_group_sig s = {.puts_before = puts_before, .offset = offset, .value = value, .seq = seq, .window = 0,
                    .op = op, .token = TOKEN};
  s.check = fab_group_sig_check(&s);
  fx->ring[seq % FAB_GROUP_RING] = s;
}

/* as the rdma transport hands a write with remote CQ data to the comm's hook */
static void landed(unsigned kind, uint32_t value) {
  fab_onesided_hook* hook = fab_comm_ext_get(fx->rc, FAB_EXT_ONESIDED);
  hook->landed(fx->rc, hook->arg, fab_group_cq_low(kind, value));
}
static void expect_refused(const char* what);

/* Put number n (from 0, in the source's order) landed. */
static void put(uint32_t n) { landed(FAB_GROUP_PUT, n); }

Test(group, signal_waits_for_the_puts_before_it) {
  place(0, 2, 8, 5, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 0); /* the record overtook both puts */
  cr_expect_eq(fx->words[1], 0, "applied before its puts landed");
  put(0);
  cr_expect_eq(fx->words[1], 0, "applied with one of its two puts missing");
  put(1);
  cr_expect_eq(fx->words[1], 5);
  cr_expect_eq(atomic_load(&fx->peers[1].sig_applied), 1);
  cr_expect_eq(ut_warns(), 0);
  cr_expect_eq(atomic_load(&fx->g.failed), 0);
}

Test(group, records_apply_in_order_once) {
  place(0, 0, 0, 1, FAB_SIGNAL_INC);
  place(1, 1, 0, 10, FAB_SIGNAL_ADD);
  place(2, 1, 16, 3, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 2);
  landed(FAB_GROUP_SIGNAL, 1);
  cr_expect_eq(fx->words[0] + fx->words[2], 0, "a later record applied before record 0");
  landed(FAB_GROUP_SIGNAL, 0);
  cr_expect_eq(fx->words[0], 1, "record 0 (INC adds 1 whatever its value)");
  cr_expect_eq(fx->words[2], 0, "records 1 and 2 follow a put that has not landed");
  put(0);
  cr_expect_eq(fx->words[0], 11);
  cr_expect_eq(fx->words[2], 3);
  put(1); /* a put with no signal after it changes nothing */
  cr_expect_eq(fx->words[0], 11);
  cr_expect_eq(atomic_load(&fx->peers[1].sig_applied), 3);
  cr_expect_eq(ut_warns(), 0);
}

Test(group, a_later_put_does_not_stand_in_for_an_earlier_one) {
  /* put 0 (large) is still on its way when put 2, posted after the signal, lands */
  place(0, 2, 8, 1, FAB_SIGNAL_ADD);
  put(1);
  put(2);
  landed(FAB_GROUP_SIGNAL, 0);
  cr_expect_eq(fx->words[1], 0, "two puts landed, but not the two the signal follows");
  put(0);
  cr_expect_eq(fx->words[1], 1);
  cr_expect_eq(fx->peers[1].puts_landed, 3);
  cr_expect_eq(ut_warns(), 0);
}

Test(group, put_numbers_wrap) {
  enum { N = 5 * (FAB_GROUP_VALUE_MASK + 1) / 2 }; /* the numbers wrap twice */
  for (uint32_t n = 0; n < N; n += 1) put(n & FAB_GROUP_VALUE_MASK);
  cr_expect_eq(fx->peers[1].puts_landed, N);
  cr_expect_eq(ut_warns(), 0);
}

Test(group, put_beyond_the_window) {
  put(FAB_GROUP_PUT_WINDOW);
  expect_refused("a put numbered past the window");
}

Test(group, put_landing_twice) {
  put(1);
  put(1);
  expect_refused("the same put landing twice");
}

Test(group, ring_wraps) {
  for (uint32_t seq = 0; seq < 3 * FAB_GROUP_RING; seq++) {
    place(seq, 0, 24, 2, FAB_SIGNAL_ADD);
    landed(FAB_GROUP_SIGNAL, seq % FAB_GROUP_RING);
  }
  cr_expect_eq(fx->words[3], 6 * FAB_GROUP_RING);
  cr_expect_eq(ut_warns(), 0);
}

static void expect_refused(const char* what) {
  cr_expect_neq(atomic_load(&fx->g.failed), 0, "%s: the group did not fail", what);
  cr_expect_eq(ut_warns(), 1, "%s: %d WARN lines, want 1", what, ut_warns());
  for (size_t i = 0; i < sizeof fx->words / sizeof fx->words[0]; i++)
    cr_expect_eq(fx->words[i], 0, "%s: word %zu written", what, i);
}

Test(group, bad_checksum) {
  place(0, 0, 0, 1, FAB_SIGNAL_ADD);
  fx->ring[0].value = 99; /* changed after the check was computed */
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a record failing its check");
}

Test(group, another_groups_token) {
  place(0, 0, 0, 1, FAB_SIGNAL_ADD);
  fx->ring[0].token ^= 1;
  fx->ring[0].check = fab_group_sig_check(&fx->ring[0]);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a record with another group's token");
}

Test(group, slot_out_of_range) {
  landed(FAB_GROUP_SIGNAL, FAB_GROUP_RING);
  expect_refused("a slot past the ring");
}

Test(group, slot_landed_twice) {
  place(0, 1, 0, 1, FAB_SIGNAL_ADD); /* waits for a put */
  landed(FAB_GROUP_SIGNAL, 0);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a slot written again before it was applied");
}

Test(group, window_not_registered) {
  place(0, 0, 0, 1, FAB_SIGNAL_ADD);
  fx->ring[0].window = 7;
  fx->ring[0].check = fab_group_sig_check(&fx->ring[0]);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a window that is not registered");
}

Test(group, window_deregistered) {
  fx->wins[0] = NULL;
  place(0, 0, 0, 1, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a deregistered window");
}

Test(group, offset_outside) {
  place(0, 0, sizeof fx->words - 4, 1, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("an offset whose word runs past the window");
}

Test(group, offset_huge) {
  place(0, 0, UINT64_MAX - 7, 1, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("an offset that wraps");
}

Test(group, unknown_operation) {
  place(0, 0, 0, 1, 3);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("an unknown operation");
}

Test(group, acknowledgement_of_signals_never_sent) {
  landed(FAB_GROUP_ACK, FAB_GROUP_RING + 1);
  expect_refused("an acknowledgement past what was sent");
  cr_expect_eq(atomic_load(&fx->peers[1].sig_acked), 0);
}

Test(group, put_acknowledgements) {
  landed(FAB_GROUP_ACK_PUTS, 300);
  cr_expect_eq(atomic_load(&fx->peers[1].puts_acked), 300);
  landed(FAB_GROUP_ACK_PUTS, 300 + FAB_GROUP_PUT_WINDOW + 1);
  expect_refused("an acknowledgement of puts past the window");
}

Test(group, acknowledgements_out_of_order) {
  /* two threads reading the CQ may dispatch a newer acknowledgement first */
  atomic_store(&fx->peers[1].sig_seq, 40);
  landed(FAB_GROUP_ACK, 30);
  landed(FAB_GROUP_ACK, 10);
  cr_expect_eq(atomic_load(&fx->peers[1].sig_acked), 30, "an older acknowledgement moved the count back");
  landed(FAB_GROUP_ACK_PUTS, 300);
  landed(FAB_GROUP_ACK_PUTS, 100);
  cr_expect_eq(atomic_load(&fx->peers[1].puts_acked), 300);
  cr_expect_eq(ut_warns(), 0);
  cr_expect_eq(atomic_load(&fx->g.failed), 0);
}

Test(group, acknowledgement_within_what_was_sent) {
  atomic_store(&fx->peers[1].sig_seq, 10);
  landed(FAB_GROUP_ACK, 4);
  cr_expect_eq(atomic_load(&fx->peers[1].sig_acked), 4);
  landed(FAB_GROUP_ACK, 11); /* one more than sent */
  expect_refused("an acknowledgement of a signal not sent yet");
}

Test(group, unknown_kind) {
  landed(7, 0);
  expect_refused("a write of an unknown kind");
}

Test(group, nothing_after_failure) {
  landed(FAB_GROUP_SIGNAL, FAB_GROUP_RING); /* fails the group */
  place(0, 0, 0, 1, FAB_SIGNAL_ADD);
  landed(FAB_GROUP_SIGNAL, 0);
  cr_expect_eq(fx->words[0], 0, "a record applied after the group failed");
  cr_expect_eq(ut_warns(), 1);
}

/* --- gets and staged chunks (GPU windows staged through host memory) ------------------------ */

Test(group, get_is_queued_for_progress) {
  place(0, 0, 8, 16, FAB_GROUP_OP_GET);
  fx->ring[0].get = 5;
  fx->ring[0].check = fab_group_sig_check(&fx->ring[0]);
  landed(FAB_GROUP_SIGNAL, 0);
  fab_group_peer* p = &fx->peers[1];
  cr_assert_eq(atomic_load(&p->ask_head), 1, "the get was not queued");
  cr_expect_eq(p->asks[0].offset, 8);
  cr_expect_eq(p->asks[0].size, 16);
  cr_expect_eq(p->asks[0].id, 5);
  cr_expect_eq(atomic_load(&fx->g.failed), 0);
  cr_expect_eq(ut_warns(), 0);
  free(p->asks);
}

Test(group, get_outside_the_window) {
  place(0, 0, 8, sizeof fx->words, FAB_GROUP_OP_GET);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a get running past its window");
  cr_expect_eq(atomic_load(&fx->peers[1].ask_head), 0);
  free(fx->peers[1].asks);
}

Test(group, get_of_nothing) {
  place(0, 0, 0, 0, FAB_GROUP_OP_GET);
  landed(FAB_GROUP_SIGNAL, 0);
  expect_refused("a get of 0 bytes");
  free(fx->peers[1].asks);
}

Test(group, chunk_without_a_staging_ring) {
  landed(FAB_GROUP_STAGED, 0); /* we made no ring: nothing may land in one */
  expect_refused("a staged chunk where there is no ring");
}

Test(group, chunk_slot_out_of_range_or_twice) {
  uint8_t landed_slots[4] = {0};
  fx->g.rx_slots = 4;
  fx->peers[1].rx_landed = landed_slots;
  landed(FAB_GROUP_STAGED, 1);
  cr_expect_eq(landed_slots[1], 1);
  cr_expect_eq(ut_warns(), 0);
  landed(FAB_GROUP_STAGED, 1);
  expect_refused("a staged chunk into a slot not yet copied out");
  fx->peers[1].rx_landed = NULL;
}

Test(group, chunk_slot_past_the_ring) {
  uint8_t landed_slots[4] = {0};
  fx->g.rx_slots = 4;
  fx->peers[1].rx_landed = landed_slots;
  landed(FAB_GROUP_STAGED, 4);
  expect_refused("a staged chunk past the ring");
  fx->peers[1].rx_landed = NULL;
}

Test(group, acknowledgement_of_chunks_never_sent) {
  fab_group_peer* p = &fx->peers[1];
  p->stage_slots = 8;
  atomic_store(&p->chunk_seq, 3);
  landed(FAB_GROUP_ACK_STAGED, 2);
  cr_expect_eq(atomic_load(&p->chunk_acked), 2);
  landed(FAB_GROUP_ACK_STAGED, 4);
  expect_refused("an acknowledgement of chunks past what was sent");
  cr_expect_eq(atomic_load(&p->chunk_acked), 2);
}
