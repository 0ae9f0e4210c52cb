"""fabgen: renders the NCCL plugin ABI layer of fabric from the specs in abi/.

Modules, in the order data flows through them:
  spec       strict TOML access: every error names the file and the key path
  versions   version ranges ("6-8", "9-") and values that change by version
  ctypes     C types, LP64 sizes and alignments, struct layouts
  types      named types (primitives, enums, callbacks, structs) and their uses
  defs       the loaded form of the specs: definitions and per-version instances
  model      loads abi/*.toml into families, structs and tables, checks layouts
  convert    turns per-argument and per-field conversions into C statements
  functions  shim and driver functions of one version's table
  params     loads core/params.toml
  render     the list of outputs, Jinja2 rendering, --check
  upstream   --check-upstream and --import: the specs against NCCL's own plugin headers
"""
