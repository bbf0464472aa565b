"""Value scans (`scan --values`): CG201-CG204 from tensor data, read in bounded chunks.

``check`` is the rule glue (files -> findings, progress, threads); ``stats`` is the
numpy kernel over raw bits (integer views; ``minifloats`` gives bf16/fp8 values from
their bits, without ml_dtypes; never an fp32 bridge).  Needs the
`values` extra, imported inside the functions; may import the inventory,
readers and catalogue, never the CLI or the report.
"""
