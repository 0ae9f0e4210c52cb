/* The core functions as a fab_api table: how tests (and tools) drive the
 * engine directly, the same way the generated drivers drive an ABI table. */
#include "fab_api.h"

const fab_api fab_api_core = {
    .name = "Fabric",
    .version = 0,
    .size_is_int = 0,
    .max_handle_size = FAB_HANDLE_SIZE,
    .init = fab_init,
    .finalize = fab_finalize,
    .devices = fab_devices,
    .get_properties = fab_get_properties,
    .make_vdevice = fab_make_vdevice,
    .set_net_attr = fab_set_net_attr,
    .listen = fab_listen,
    .connect = fab_connect,
    .accept = fab_accept,
    .close_send = fab_close_send,
    .close_recv = fab_close_recv,
    .close_listen = fab_close_listen,
    .reg_mr = fab_reg_mr,
    .reg_mr_dmabuf = fab_reg_mr_dmabuf,
    .dereg_mr = fab_dereg_mr,
    .isend = fab_isend,
    .irecv = fab_irecv,
    .iflush = fab_iflush,
    .test = fab_test,
};
