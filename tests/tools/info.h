/*
 * fabric-info: what the plugin sees on this machine, and a loopback self-test
 * through its own exported table. Installed with the library. See
 * docs/troubleshooting.md ("fabric-info").
 *
 *   info_probe.c     libfabric's version and providers, the environment that
 *                    steers the choice, the plugin's exported tables and what
 *                    each net version reports for each device
 *   info_selftest.c  two processes, one sends the other a transfer through
 *                    the newest net table, every byte checked
 *   info_profiles.c  --profiles: the transport and one-sided calls under
 *                    each test-only NIC profile
 *   fabric_info.c    the command line, and the report as text or JSON
 */
#ifndef FABRIC_INFO_H
#define FABRIC_INFO_H

#include <stddef.h>

#include "fab_api.h"

enum {
  INFO_MAX_PROVIDERS = 32,
  INFO_MAX_ENV = 32,
  INFO_MAX_TABLES = 40,
  INFO_MAX_LOG = 64,
  INFO_MAX_DEVS = 8,
  INFO_MAX_VERSIONS = 8,
  INFO_LINE = 512,
};

typedef struct {
  int version;       /* ncclNetPlugin_vN */
  int neuron;        /* 1: Neuron's table of that name (libnccom-net-fabric.so) */
  int ndev;
  fab_properties props[INFO_MAX_DEVS];
  char names[INFO_MAX_DEVS][128];   /* copies of props[].name */
  char pci[INFO_MAX_DEVS][256];     /* copies of props[].pci_path ("" when NULL) */
  char error[INFO_LINE];            /* "" when the version answered */
} info_version;

typedef struct {
  char fi_version[32];
  char providers[INFO_MAX_PROVIDERS][64];
  int nproviders;
  char env[INFO_MAX_ENV][INFO_LINE];
  int env_unknown[INFO_MAX_ENV];    /* 1: a FABRIC_ name this plugin does not read (a typo?) */
  char env_ignored[INFO_MAX_ENV][INFO_LINE]; /* why the plugin ignores this FABRIC_ value ("" when it takes it) */
  int nenv, nunknown;
  char nccl[2][INFO_LINE];          /* why NCCL would not load or select this plugin ("" when it would) */
  int nnccl;
  char plugin[INFO_LINE];           /* the path asked for */
  char plugin_file[INFO_LINE];      /* the file the loader picked */
  char load_error[INFO_LINE];       /* "" when it loaded */
  char tables[INFO_MAX_TABLES][40];
  int ntables;
  info_version versions[INFO_MAX_VERSIONS];
  int nversions;
  char log[INFO_MAX_LOG][INFO_LINE];
  int log_level[INFO_MAX_LOG];
  int nlog;
  int warns;
  /* --selftest */
  int selftest_ran, selftest_ok;
  size_t selftest_bytes;
  double selftest_seconds;
  char selftest_detail[INFO_LINE];
} info_report;

/* Fills everything but the self-test; 0 when the plugin loaded and reported
 * at least one device through every exported net version. */
int info_probe(info_report* r, const char* plugin_path);
/* The loopback self-test through the newest net table; 0 when every byte
 * arrived. Runs in two processes (it forks). */
int info_selftest(info_report* r, const char* plugin_path, size_t bytes, int timeout_ms);

/* --profiles: a table of what the plugin chooses under each test-only NIC
 * profile (FABRIC_NIC_PROFILE), each probed in a child process; 0 when it
 * started under every one. Prints as it goes. */
int info_profiles(const char* plugin_path);

/* The plugin's log lines, captured for the report (a fab_logger_fn). */
void info_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
void info_log_attach(info_report* r);

/* The newest ncclNetPlugin_vN the library exports, bound into *api; 0 or -1.
 * A library named libnccom* is the Neuron one: its tables are Neuron's. */
int info_bind_newest(void* dl, fab_api* api, char* symbol, size_t len);
/* 1 when the library dl is the Neuron one (its file name starts libnccom). */
int info_is_neuron(void* dl);

#endif
