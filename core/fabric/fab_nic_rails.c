/*
 * How many rails each NIC gets when FABRIC_NIC_RAILS is 0 (the default).
 *
 * A socket provider (tcp) copies every byte on the host's CPUs, and one tcp
 * connection is driven by one core at a time: inside NCCL a rank's single
 * connection per NIC moves about what one core copies, which is also where
 * NCCL's Socket transport stops on a NIC it does not know (on the NICs it
 * does, AWS's and Google's, Socket opens several sockets and threads per
 * connection). Several rails over the NIC, each with its polling thread,
 * spread those copies over several cores (docs/performance.md: four rails
 * moved about twice Socket's bus bandwidth). They cost a core each while
 * large messages move, an endpoint each (on libfabric 1.17's tcp about
 * 104 MiB of provider buffers) and connections to each peer per rail, so the
 * engine takes them only where they can pay:
 *   - a socket provider (a NIC that moves data itself gains nothing);
 *   - an interface not known to be slower than FAB_NIC_RAILS_FAST_MBPS (one
 *     connection fills a slower one);
 *   - a process that may run on at least twice as many CPUs as the rails'
 *     threads and the runtime's own thread need (mpirun's default binding of
 *     a rank to one core gets one rail);
 *   - at most FAB_MAX_VDEV_DEVS rails over all NICs, since the runtime may
 *     fuse every NIC into one device (makeVDevice) and a device has at most
 *     that many.
 * Ranks that choose differently connect over the smaller count (rail 0's
 * handshake agrees it, fab_listen.c).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>

#include "fab_engine.h"

int fab_nic_rails_rule(int socket_provider, int cpus, const int* known_mbps, int nics, char* why, size_t why_len) {
  if (!socket_provider) {
    snprintf(why, why_len, "not a socket provider: more connections would add no copying cores");
    return 1;
  }
  int slow = 0; /* interfaces known to be slower than FAB_NIC_RAILS_FAST_MBPS */
  for (int i = 0; i < nics; i++) slow += known_mbps[i] > 0 && known_mbps[i] < FAB_NIC_RAILS_FAST_MBPS;
  if (nics > 0 && slow == nics) {
    snprintf(why, why_len, "every interface is slower than %d Gb/s, which one connection fills",
             FAB_NIC_RAILS_FAST_MBPS / 1000);
    return 1;
  }
  for (int rails = FAB_NIC_RAILS_AUTO_MAX; rails > 1; rails /= 2) {
    if (rails * nics > FAB_MAX_VDEV_DEVS) continue; /* the runtime may fuse every NIC: at most 8 rails in all */
    if (cpus >= 2 * (rails + 1)) {
      snprintf(why, why_len, "a socket provider, %d NIC%s, and this process may run on %d CPUs", nics,
               nics == 1 ? "" : "s", cpus);
      return rails;
    }
  }
  if (2 * nics > FAB_MAX_VDEV_DEVS) {
    snprintf(why, why_len, "%d NICs: the runtime may fuse them all, and %d rails in all is the most", nics,
             FAB_MAX_VDEV_DEVS);
    return 1;
  }
  snprintf(why, why_len, "this process may run on %d CPU%s, fewer than the 6 that 2 rails with threads need", cpus,
           cpus == 1 ? "" : "s");
  return 1;
}

/* The CPUs this process may run on (its affinity); 1 where unknown. */
static int cpus_allowed(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

int fab_nic_rails_choose(int nics) {
  if (nics < 1) return 1;
  if (fab_g.params.rails > 1) return 1; /* FABRIC_RAILS lists copies of its own (tests) */
  int known[FAB_MAX_DEVICES];
  for (int i = 0; i < nics; i++) known[i] = fab_iface_known_speed_mbps(fab_g.devs[i]->info);
  char why[160];
  int rails = fab_nic_rails_rule(fab_iface_socket_provider(fab_g.devs[0]->info), cpus_allowed(), known, nics, why,
                                 sizeof(why));
  if (rails > 1)
    FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "FABRIC_NIC_RAILS=0: %d rails per NIC, each with a polling thread (%s); "
             "FABRIC_NIC_RAILS=1 keeps one connection per NIC", rails, why);
  else
    FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "FABRIC_NIC_RAILS=0: one connection per NIC (%s)", why);
  return rails;
}
