"""fabgen: renders the NCCL plugin ABI layer of fabric from the specs in abi/.

Modules, in the order data flows through them:
  spec      strict TOML access: every error names the file and the key path
  versions  version ranges ("6-8", "9-") and values that change by version
  ctypes    C types, LP64 sizes and alignments, struct layouts
  model     loads abi/*.toml into families, structs and tables, checks layouts
  convert   turns per-argument and per-field conversions into C statements
  params    loads core/params.toml
  render    the list of outputs, Jinja2 rendering, --check
"""
