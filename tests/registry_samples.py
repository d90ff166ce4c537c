"""Registry file texts the loader tests start from."""

# aten.mm's file as the sweep writes it: one entry, three strategies
MM = """\
schema: 1
op: aten.mm.default
backend: torch
status: ok
entries:
- signature: self:f[*,*] mat2:f[*,*]
  status: ok
  shard: [[S1, S2], [S2, S3]]
  combine: {S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}
  example:
    self: {shape: [6, 4], dtype: float64}
    mat2: {shape: [4, 5], dtype: float64}
  verified: {trials: 3, shard_counts: [2, 3], uneven: true}
  results:
  - {shape: [6, 5], dtype: float64}
"""
