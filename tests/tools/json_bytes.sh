#!/usr/bin/env bash
# fabric-info --json stays valid UTF-8 JSON when what it reports holds bytes that are not UTF-8 (a setting's
# value here; a path or an interface name can do the same): such bytes come out as U+FFFD, the rest intact.
#   json_bytes.sh FABRIC_INFO PLUGIN
set -euo pipefail
info=$1 plugin=$2
bad=$(printf 'caf\303\251 \377\376 end') # "café", then two bytes that are no UTF-8, then " end"
FABRIC_BOGUS_SETTING="$bad" FI_PROVIDER=shm "$info" --json --plugin "$plugin" | python3 -c '
import json, sys
raw = sys.stdin.buffer.read()
r = json.loads(raw.decode("utf-8"))          # strict: invalid UTF-8 fails here
line = [s for s in r["settings"] if s.startswith("FABRIC_BOGUS_SETTING")]
assert line, r["settings"]
assert "caf\u00e9 \ufffd\ufffd end" in line[0], line
assert any(s.startswith("FABRIC_BOGUS_SETTING") for s in r["unknownSettings"]), r["unknownSettings"]
assert r["schema"] == 3 and r["devices"] and r["devices"][0]["provider"] == "shm", r["devices"]
assert r["gpuMemory"]["code"] and r["oneSided"]["code"] == "needs_rdma_transport", (r["gpuMemory"], r["oneSided"])
print("json bytes ok")
'
