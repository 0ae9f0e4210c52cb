/* 5. Properties of every device, as NCCL reads them through the version. */
#include <stdio.h>

#include "ft_criterion.h"

static void check_device(ft_side* s, int dev) {
  fab_properties p;
  memset(&p, 0xee, sizeof p); /* garbage in: every field must be written */
  ft_phase("getProperties(%d)", dev);
  FT_OK(s->api->get_properties(dev, &p));
  FT_CHECK(p.name != NULL && p.name[0] != 0, "device %d: empty name", dev);
  FT_CHECK(strlen(p.name) < FAB_NAME_MAX, "device %d: name longer than %d", dev, FAB_NAME_MAX);
  FT_CHECK(p.ptr_support & FAB_PTR_HOST, "device %d: ptrSupport 0x%x lacks NCCL_PTR_HOST", dev, p.ptr_support);
  FT_CHECK((p.ptr_support & ~(FAB_PTR_HOST | FAB_PTR_CUDA | FAB_PTR_DMABUF)) == 0, "device %d: ptrSupport 0x%x",
           dev, p.ptr_support);
  FT_CHECK(!(p.ptr_support & FAB_PTR_DMABUF) || s->api->reg_mr_dmabuf != NULL,
           "device %d: DMABUF advertised without regMrDmaBuf", dev);
  FT_CHECK(p.max_recvs >= 1 && p.max_recvs <= FAB_MAX_RECVS, "device %d: maxRecvs %d", dev, p.max_recvs);
  FT_CHECK(p.speed_mbps > 0, "device %d: speed %d", dev, p.speed_mbps);
  FT_CHECK(p.max_comms > 0, "device %d: maxComms %d", dev, p.max_comms);
  FT_CHECK(p.latency_us >= 0.0f && p.latency_us < 1e6f, "device %d: latency %g", dev, (double)p.latency_us);
  FT_CHECK(p.port >= 0, "device %d: port %d", dev, p.port);
  FT_CHECK(p.net_device_type == 0, "device %d: netDeviceType %d; a host plugin reports 0 (HOST)", dev,
           p.net_device_type);
  FT_CHECK(p.net_device_version == 0, "device %d: netDeviceVersion %d for HOST", dev, p.net_device_version);
  if (ft_has_reg_is_global(&s->lib)) FT_CHECK(p.reg_is_global == 0 || p.reg_is_global == 1, "regIsGlobal %d", p.reg_is_global);
  if (ft_net_since(&s->lib, 9)) {
    FT_CHECK(p.force_flush == 0 || p.force_flush == 1, "device %d: forceFlush %d", dev, p.force_flush);
    FT_CHECK(p.vprops.ndevs == 1 && p.vprops.devs[0] == dev, "device %d: vProps {%d, {%d, ...}}, expected {1, {%d}}",
             dev, p.vprops.ndevs, p.vprops.devs[0], dev);
    FT_CHECK(p.max_p2p_bytes >= ((size_t)256 << 20), "device %d: maxP2pBytes %zu < 256 MiB", dev, p.max_p2p_bytes);
    FT_CHECK(p.max_p2p_bytes <= ((size_t)1 << 40), "device %d: maxP2pBytes %zu above NCCL's 1 TiB", dev,
             p.max_p2p_bytes);
    FT_CHECK(p.max_p2p_bytes <= (size_t)INT32_MAX, "device %d: maxP2pBytes %zu does not fit the int test() sizes",
             dev, p.max_p2p_bytes);
    FT_CHECK(p.max_coll_bytes > 0 && p.max_coll_bytes <= ((size_t)1 << 40), "device %d: maxCollBytes %zu", dev,
             p.max_coll_bytes);
  }
  if (ft_net_since(&s->lib, 11))
    FT_CHECK(p.max_multi_request_size >= 1, "device %d: maxMultiRequestSize %d", dev, p.max_multi_request_size);
  if (ft_net_since(&s->lib, 12)) {
    FT_CHECK(p.rail_id >= -1, "device %d: railId %d", dev, p.rail_id);
    FT_CHECK(p.plane_id >= -1, "device %d: planeId %d", dev, p.plane_id);
  }
  fprintf(stderr, "[properties %s] dev %d: name=%s pci=%s guid=0x%llx ptr=0x%x speed=%d Mb/s lat=%.1f us "
                  "maxComms=%d maxRecvs=%d maxP2p=%zu\n",
          s->lib.desc, dev, p.name, p.pci_path ? p.pci_path : "(null)", (unsigned long long)p.guid, p.ptr_support,
          p.speed_mbps, (double)p.latency_us, p.max_comms, p.max_recvs,
          ft_net_since(&s->lib, 9) ? p.max_p2p_bytes : (size_t)0);
}

Test(functional, properties, .init = ft_test_init, .timeout = 30) {
  ft_side s;
  ft_side_open(&s, NULL, ft_api_selected());
  FT_CHECK(s.api->name != NULL && s.api->name[0], "the table has no name");
  for (int dev = 0; dev < s.ndev; dev++) check_device(&s, dev);
  /* The same answer twice (NCCL calls it per communicator). */
  fab_properties a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  FT_OK(s.api->get_properties(0, &a));
  FT_OK(s.api->get_properties(0, &b));
  FT_CHECK(a.name == b.name || strcmp(a.name, b.name) == 0, "device 0 changed its name");
  FT_CHECK(a.speed_mbps == b.speed_mbps && a.max_recvs == b.max_recvs && a.guid == b.guid,
           "device 0 properties changed between two calls");
  /* devices() again is stable. */
  int n2 = -1;
  FT_OK(s.api->devices(&n2));
  FT_CHECK(n2 == s.ndev, "devices() said %d, then %d", s.ndev, n2);
  /* setNetAttr (v11+, optional): NCCL's hints are accepted. */
  if (s.api->set_net_attr) {
    fab_net_attr attr = {.send_attr = {1, 1, 2, 1}, .recv_attr = {1, 1, 2, 1}, .op = 1u << 2, .algo = 1u << 1,
                         .proto = 1u << 2};
    FT_OK(s.api->set_net_attr(s.ctx, &attr));
  }
  /* Out of range devices are errors, with one WARN each. */
  fab_properties p;
  FT_EXPECT_ERROR(s.api->get_properties(-1, &p));
  FT_EXPECT_ERROR(s.api->get_properties(s.ndev, &p));
  FT_EXPECT_ERROR(s.api->get_properties(s.ndev + 1000, &p));
  ft_side_close(&s);
  FT_CHECK(!ft_leak_check(), "LeakSanitizer found leaks after unloading the plugin");
}
