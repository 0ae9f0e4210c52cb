#include "fab_wire.h"

#include <stdio.h>
#include <string.h>

#include "fab_util.h"

#define WHY(...) (why ? (void)snprintf(why, why_len, __VA_ARGS__) : (void)0)

/* The checksum covers the whole structure with the checksum field zeroed. */
#define SEAL(m)                      \
  do {                               \
    (m)->checksum = 0;               \
    (m)->checksum = fab_crc32c((m), sizeof(*(m))); \
  } while (0)

static int check_sum(void* copy, uint32_t* field, size_t size) {
  uint32_t got = *field;
  *field = 0;
  uint32_t want = fab_crc32c(copy, size);
  *field = got;
  return got == want ? 0 : -1;
}

int fab_wire_handle_encode(void* buf, size_t cap, uint64_t listen_id, uint32_t prov_hash, const void* addr,
                           size_t addr_len) {
  if (cap > FAB_HANDLE_SIZE) cap = FAB_HANDLE_SIZE;
  if (addr_len == 0 || addr_len > FAB_ADDR_MAX || FAB_HANDLE_HEADER + addr_len > cap) return -1;
  fab_wire_handle h;
  memset(&h, 0, sizeof(h));
  h.magic = FAB_HANDLE_MAGIC;
  h.version = FAB_WIRE_VERSION;
  h.addr_len = (uint16_t)addr_len;
  h.listen_id = listen_id;
  h.prov_hash = prov_hash;
  memcpy(h.addr, addr, addr_len);
  h.checksum = fab_crc32c(&h, FAB_HANDLE_HEADER + addr_len);
  memcpy(buf, &h, cap);
  return 0;
}

size_t fab_wire_handle_used(const void* buf) {
  fab_wire_handle h;
  memcpy(&h, buf, FAB_HANDLE_HEADER);
  return FAB_HANDLE_HEADER + (h.addr_len <= FAB_ADDR_MAX ? h.addr_len : 0);
}

int fab_wire_handle_decode(const void* buf, fab_wire_handle* out, char* why, size_t why_len) {
  fab_wire_handle h;
  memset(&h, 0, sizeof(h));
  memcpy(&h, buf, FAB_HANDLE_HEADER);
  if (h.magic != FAB_HANDLE_MAGIC) {
    WHY("bad magic 0x%08x (not a handle written by this plugin's listen)", h.magic);
    return -1;
  }
  if (h.version != FAB_WIRE_VERSION) {
    WHY("protocol version %u, this build speaks %u (mixed plugin versions?)", h.version, (unsigned)FAB_WIRE_VERSION);
    return -1;
  }
  if (h.addr_len == 0 || h.addr_len > FAB_ADDR_MAX) {
    WHY("address length %u out of range 1..%d", h.addr_len, FAB_ADDR_MAX);
    return -1;
  }
  memcpy(h.addr, (const char*)buf + FAB_HANDLE_HEADER, h.addr_len);
  if (check_sum(&h, &h.checksum, FAB_HANDLE_HEADER + h.addr_len) != 0) {
    WHY("checksum mismatch (the handle bytes were corrupted in transit)");
    return -1;
  }
  if (!h.listen_id) {
    WHY("listen id is 0");
    return -1;
  }
  *out = h;
  return 0;
}

void fab_wire_connect_encode(fab_wire_connect* m, uint64_t listen_id, uint32_t connector_id, const void* addr,
                             size_t addr_len, const fab_wire_tp* tp, int rails, int rail, uint32_t stripe_from) {
  memset(m, 0, sizeof(*m));
  m->rails = (uint8_t)rails;
  m->rail = (uint8_t)rail;
  m->stripe_from = rails > 1 ? stripe_from : 0;
  m->magic = FAB_CONNECT_MAGIC;
  m->version = FAB_WIRE_VERSION;
  m->addr_len = (uint16_t)(addr_len <= FAB_ADDR_MAX ? addr_len : 0);
  m->listen_id = listen_id;
  m->connector_id = connector_id;
  memcpy(m->addr, addr, m->addr_len);
  m->tp = *tp;
  SEAL(m);
}

int fab_wire_connect_decode(const void* buf, size_t len, fab_wire_connect* out, char* why, size_t why_len) {
  if (len != sizeof(fab_wire_connect)) {
    WHY("connect request of %zu bytes, expected %zu", len, sizeof(fab_wire_connect));
    return -1;
  }
  fab_wire_connect m;
  memcpy(&m, buf, sizeof(m));
  if (m.magic != FAB_CONNECT_MAGIC || m.version != FAB_WIRE_VERSION) {
    WHY("connect request with magic 0x%08x version %u", m.magic, m.version);
    return -1;
  }
  if (check_sum(&m, &m.checksum, sizeof(m)) != 0) {
    WHY("connect request checksum mismatch");
    return -1;
  }
  if (m.addr_len == 0 || m.addr_len > FAB_ADDR_MAX) {
    WHY("connect request address length %u", m.addr_len);
    return -1;
  }
  if (m.tp.len > FAB_TP_MAX) {
    WHY("connect request transport data of %u bytes (at most %d)", m.tp.len, FAB_TP_MAX);
    return -1;
  }
  if (m.rails < 1 || m.rails > FAB_MAX_RAILS || m.rail >= m.rails) {
    WHY("connect request for rail %u of %u (1..%d rails)", m.rail, m.rails, FAB_MAX_RAILS);
    return -1;
  }
  if (m.stripe_from && (m.rails == 1 || m.stripe_from < FAB_STRIPE_MIN)) {
    WHY("connect request with stripe threshold %u over %u rails (0, or at least %d over several)", m.stripe_from,
        m.rails, FAB_STRIPE_MIN);
    return -1;
  }
  *out = m;
  return 0;
}

void fab_wire_accept_encode(fab_wire_accept* m, uint16_t status, uint64_t listen_id, uint32_t connector_id,
                            uint32_t conn_id, const fab_wire_tp* tp, int rails, int rail) {
  memset(m, 0, sizeof(*m));
  m->rails = (uint8_t)rails;
  m->rail = (uint8_t)rail;
  m->magic = FAB_ACCEPT_MAGIC;
  m->version = FAB_WIRE_VERSION;
  m->status = status;
  m->listen_id = listen_id;
  m->connector_id = connector_id;
  m->conn_id = conn_id;
  if (tp) m->tp = *tp;
  SEAL(m);
}

size_t fab_wire_accept_len(const fab_wire_accept* m) {
  int handles = m->status == FAB_ACCEPT_OK && m->rail == 0 && m->rails > 1 ? m->rails - 1 : 0;
  return sizeof(*m) + (size_t)handles * FAB_HANDLE_SIZE;
}

int fab_wire_accept_decode(const void* buf, size_t len, fab_wire_accept* out, char* why, size_t why_len) {
  if (len < sizeof(fab_wire_accept)) {
    WHY("answer of %zu bytes, expected at least %zu", len, sizeof(fab_wire_accept));
    return -1;
  }
  fab_wire_accept m;
  memcpy(&m, buf, sizeof(m));
  if (m.magic != FAB_ACCEPT_MAGIC || m.version != FAB_WIRE_VERSION) {
    WHY("answer with magic 0x%08x version %u", m.magic, m.version);
    return -1;
  }
  if (check_sum(&m, &m.checksum, sizeof(m)) != 0) {
    WHY("answer checksum mismatch");
    return -1;
  }
  if (m.status == FAB_ACCEPT_OK && m.conn_id == 0) {
    WHY("answer assigns connection id 0");
    return -1;
  }
  if (m.tp.len > FAB_TP_MAX) {
    WHY("answer with transport data of %u bytes (at most %d)", m.tp.len, FAB_TP_MAX);
    return -1;
  }
  if (m.rails < 1 || m.rails > FAB_MAX_RAILS || m.rail >= m.rails) {
    WHY("answer for rail %u of %u (1..%d rails)", m.rail, m.rails, FAB_MAX_RAILS);
    return -1;
  }
  if (len != fab_wire_accept_len(&m)) {
    WHY("answer of %zu bytes, expected %zu for rail %u of %u", len, fab_wire_accept_len(&m), m.rail, m.rails);
    return -1;
  }
  *out = m;
  return 0;
}

const char* fab_wire_status_str(unsigned status) {
  switch (status) {
    case FAB_ACCEPT_OK: return "accepted";
    case FAB_ACCEPT_NO_LISTENER: return "no such listener (closed, or the handle belongs to another process)";
    case FAB_ACCEPT_BAD_ADDRESS: return "the listener could not use the connector's address";
    case FAB_ACCEPT_TRANSPORT:
      return "the listener runs another transport; set the same FABRIC_TRANSPORT (and provider) on every rank";
    case FAB_ACCEPT_BAD_PAYLOAD: return "the listener's transport refused this connection's data (see its log)";
    case FAB_ACCEPT_RAILS:
      return "the listener did not take this rail of the connection (a build that needs the same rail count on both "
             "ends, or a rail count other than the one rail 0 agreed)";
    default: return "unknown status";
  }
}

int fab_tag_layout_init(fab_tag_layout* t, uint64_t mem_tag_format) {
  int bits = mem_tag_format ? 64 - __builtin_clzll(mem_tag_format) : 64;
  if (bits < 34 + FAB_TAG_MIN_CONN_BITS) return -1;
  int conn_bits = bits - 34;
  if (conn_bits > 30) conn_bits = 30;
  t->bits = bits;
  t->ctrl = 1ULL << (bits - 1);
  t->answer = 1ULL << (bits - 2);
  t->conn_max = (uint32_t)((1ULL << conn_bits) - 1);
  return 0;
}

void fab_wire_window_encode(fab_wire_window* m, uint16_t op, uint32_t target_id, uint32_t source_id, uint32_t conn_id,
                            uint64_t id, uint64_t va, uint64_t addr, uint64_t len, uint64_t key) {
  memset(m, 0, sizeof(*m));
  m->magic = FAB_WINDOW_MAGIC;
  m->version = FAB_WIRE_VERSION;
  m->op = op;
  m->target_id = target_id;
  m->source_id = source_id;
  m->conn_id = conn_id;
  m->id = id;
  m->va = va;
  m->addr = addr;
  m->len = len;
  m->key = key;
  SEAL(m);
}

int fab_wire_window_decode(const void* buf, size_t len, fab_wire_window* out, char* why, size_t why_len) {
  if (len != sizeof(fab_wire_window)) {
    WHY("window offer of %zu bytes, expected %zu", len, sizeof(fab_wire_window));
    return -1;
  }
  fab_wire_window m;
  memcpy(&m, buf, sizeof(m));
  if (m.magic != FAB_WINDOW_MAGIC || m.version != FAB_WIRE_VERSION) {
    WHY("window offer with magic 0x%08x version %u", m.magic, m.version);
    return -1;
  }
  if (check_sum(&m, &m.checksum, sizeof(m)) != 0) {
    WHY("window offer checksum mismatch");
    return -1;
  }
  if (m.op < FAB_WINDOW_ADD || m.op > FAB_NOTE_DELIVERY_ANSWER) {
    WHY("window offer with operation %u", m.op);
    return -1;
  }
  if (m.op == FAB_WINDOW_ADD && (m.len == 0 || m.va + m.len < m.va || m.addr + m.len < m.addr)) {
    WHY("window offer of %llu bytes at 0x%llx (address %llu) wraps around", (unsigned long long)m.len,
        (unsigned long long)m.va, (unsigned long long)m.addr);
    return -1;
  }
  *out = m;
  return 0;
}

uint32_t fab_wire_magic(const void* buf, size_t len) {
  uint32_t magic = 0;
  if (len >= sizeof(magic)) memcpy(&magic, buf, sizeof(magic));
  return magic;
}
