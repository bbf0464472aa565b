"""One conversion, start to finish: findings plus the figures for ``report.extra["conversion"]``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from guard import dtypes
from guard.convert.carry import carry_files, main_dtype, read_config
from guard.convert.legacy_config import flax_target_config
from guard.convert.map.mapping import plan_mapping
from guard.convert.read.dequant import DequantError
from guard.convert.read.dequant.full_precision import dequantized_cast, drop_quantization_files, full_precision_config
from guard.convert.read.io_orbax import is_orbax_checkpoint
from guard.convert.read.source import SourceModel, open_source
from guard.convert.read.source_orbax import open_orbax
from guard.convert.read.source_training import adapt_names, find_training_source
from guard.errors import GuardError, MalformedCheckpoint, UsageError
from guard.findings import Finding, Severity
from guard.progress import progress
from guard.records import Record
from guard.write.cast import CastPolicy
from guard.write.publish import discard, make_temp_dir, publish
from guard.write.verify import verify_output
from guard.write.writer import LAYOUTS, Naming, OutputTensor, plan_shards, write_output


class ConvertRequest(Record):
    src: Path
    out: Path
    to: str  # "flax" | "torch"
    cast: CastPolicy
    max_shard_size: int
    allow_lossy: bool = False
    strict: bool = False  # refuse instead of dropping tensors the target class has no place for
    layout: str | None = None  # None: the framework's default (safetensors, msgpack); "orbax" for flax
    verify: str = "sampled"  # "sampled" | "full" (verify.py says what each checks)
    variant: str | None = None  # the weight set to read: None is the one the scanner calls primary
    naming: Naming | None = None  # the written files' names (fix: a variant's); None: model.safetensors, ...
    dequantize: bool = False  # a quantized source is refused unless this says to write it in full precision
    config: Path | None = None  # --config: the folder (or its config.json) describing a training checkpoint's model

    @property
    def output_layout(self) -> str:
        return output_layout(self.to, self.layout)


def config_folder(path: Path) -> Path:
    """--config: a folder holding config.json, or that file itself; a UsageError for anything else."""
    folder = path if path.is_dir() else path.parent
    if path.name != "config.json" and not path.is_dir() or not (folder / "config.json").is_file():
        raise UsageError(f"{path}: --config names neither a config.json nor a folder holding one")
    return folder


def output_layout(to: str, layout: str | None) -> str:
    """The layout to write: ``layout``, or the framework's default; a UsageError when ``to`` has no such."""
    layout = layout or LAYOUTS[to][0]
    if layout not in LAYOUTS[to]:
        raise UsageError(f"--layout {layout} is not a {to} layout (choose {', '.join(LAYOUTS[to])})")
    return layout


def check_paths(src: Path, out: Path) -> None:
    if not src.is_dir():
        raise UsageError(f"{src}: not a model directory")
    if out.resolve() == src.resolve():
        raise UsageError(f"{out}: --out is SRC itself; choose another directory (SRC is never overwritten)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out}: already exists and is not empty; choose a new --out directory")


FLAX_CONFIG_NEXT_STEP = ("transformers 4's Flax classes cannot compute what config.json means; for JAX, convert "
                         "with --to maxtext, or load the safetensors with a JAX stack that reads them itself "
                         "(tunix, keras-hub, EasyDeL)")


def _blocking(findings: list[Finding]) -> bool:
    return any(f.severity is Severity.error for f in findings)


def convert_model(req: ConvertRequest) -> tuple[list[Finding], dict[str, Any]]:
    start = time.monotonic()
    check_paths(req.src, req.out)
    layout = req.output_layout
    training = None if is_orbax_checkpoint(req.src) else find_training_source(req.src)  # DeepSpeed, ...
    config_dir = training.config_dir if training is not None else req.src
    if req.config is not None:
        config_dir = config_folder(req.config)
    config, findings = read_config(config_dir)
    if is_orbax_checkpoint(req.src):
        if req.variant is not None:
            raise UsageError(f"{req.src}: an Orbax checkpoint has no variants; drop --variant")
        source = open_orbax(req.src)
    elif training is not None:
        if req.variant is not None:
            raise UsageError(f"{req.src}: a training checkpoint has no variants; drop --variant")
        source = adapt_names(training.layout, training.open(), config)  # torchtitan's, Megatron's names as HF's
    else:
        source = open_source(req.src, to=req.to, variant=req.variant)
    findings += source.findings
    quantized = None if _blocking(findings) else _quantization(req, source)
    figures: dict[str, Any] = {
        "source": str(req.src), "output": str(req.out), "from": source.format, "to": req.to,
        "dtype": req.cast.target or "keep", "keep_fp32": list(req.cast.keep_fp32),
        "layout": layout, "variant": req.variant, "shards_in": len(source.files), "tensors_in": len(source.tensors),
        "written": False,
    }
    if _blocking(findings):
        return findings, figures
    stored = source  # the set as stored: where a dequantizer's complaint points
    if quantized is not None:
        from guard.convert.read.dequant.source import dequantized_source, refusal

        figures["dequantized"] = {"method": quantized.quant.method, "label": quantized.quant.label,
                                  "modules": len(quantized.modules)}
        findings += quantized.findings
        if _blocking(findings):
            return findings, figures
        try:
            source = dequantized_source(source, quantized, config)
        except DequantError as exc:
            return findings + [refusal(exc, source)], figures
        req = req._replace(cast=dequantized_cast(req.cast, config))
        figures["dtype"] = req.cast.target
    for tensor in source.tensors:
        info = dtypes.DTYPES.get(tensor.info.dtype)
        if info is None or info.numpy is None or info.bits < 8:
            raise UsageError(f"{tensor.info.file}: {tensor.name} is {tensor.info.dtype}, which convert cannot "
                             "carry yet (sub-byte or unknown dtype)")
    if req.to == "flax" and config is not None:  # the keys transformers 4 reads (the mapping's ties read them too);
        # what its Flax classes cannot compute is refused
        config, config_findings = flax_target_config(config, where=str(req.src / "config.json"))
        findings += config_findings
        if _blocking(findings):
            figures["next_step"] = FLAX_CONFIG_NEXT_STEP
            return findings, figures
    mapping, mapping_findings, mapping_figures = plan_mapping(source, config, to=req.to, src=req.src,
                                                              strict=req.strict)
    findings += mapping_findings
    figures.update(mapping_figures)
    if _blocking(findings):
        return findings, figures
    sep = "/" if req.to == "flax" else "."
    outputs = [OutputTensor(m, sep.join(m.target), req.cast.dtype_for(m.source.info.dtype, m.source.name,
                                                                       sep.join(m.target)))
               for m in mapping.tensors]
    shards = plan_shards(outputs, req.max_shard_size)
    if training is not None and req.to == "torch" and isinstance(config, dict):  # what loading will do with it
        from guard.rules.loading import consolidation_findings

        findings += consolidation_findings(config, [(o.name, o.shape) for o in outputs], out=str(req.out))
        if _blocking(findings):  # missing experts, a head, a shape the config contradicts: nothing published
            return findings, figures

    def ticks(it: Any) -> Any:
        verb = "dequantizing" if quantized is not None else "converting"
        return progress(it, total=len(outputs), desc=f"{verb} to {req.to}", unit="tensors")

    temp = make_temp_dir(req.out)
    try:
        written = write_output(temp, shards, layout=layout, ticks=ticks, checksum=req.verify == "full",
                               naming=req.naming)
        verify_findings, verified = verify_output(temp, outputs, written, layout=layout, full=req.verify == "full")
        cast_findings = written.cast_findings
        if req.allow_lossy:
            cast_findings = [f._replace(severity=Severity.warning) for f in cast_findings]
        findings += cast_findings + verify_findings
        figures["verification"] = req.verify
        counts = _param_counts(outputs)
        figures.update(_output_figures(outputs, source, 1 if layout == "orbax" else len(shards), verified))
        if _blocking(findings):
            discard(temp)
            return findings, figures
        if quantized is not None:
            config = full_precision_config(config)
        figures["carried"] = carry_files(config_dir, temp, config=config, dtype_name=main_dtype(counts))
        if quantized is not None:
            figures["carried"] = drop_quantization_files(temp, figures["carried"])
        publish(temp, req.out)
    except DequantError as exc:  # a module the headers promised turns out inconsistent when read
        discard(temp)
        return findings + [refusal(exc, stored)], figures
    except (MalformedCheckpoint, OSError) as exc:  # a source that turns out unreadable mid-way, a full disk
        discard(temp)
        raise GuardError(f"{req.src}: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}; "
                         "nothing written") from None
    except BaseException:
        discard(temp)  # nothing half-written survives Ctrl-C or a crash
        raise
    figures.update(written=True, seconds=round(time.monotonic() - start, 3))
    return findings, figures


def _quantization(req: ConvertRequest, source: SourceModel):
    """The source's quantization; refused in one line (exit 2) unless --dequantize asks for full precision."""
    from guard.convert.read.dequant.source import open_quantization

    if source.format == "orbax" and not req.dequantize:
        return None  # an Orbax tree holds no quantization record convert reads
    quantized = open_quantization(req.src, source)
    if quantized is None and req.dequantize:
        raise UsageError(f"{req.src}: --dequantize: the weights are not quantized; convert without it")
    if quantized is not None and not req.dequantize:
        raise UsageError(f"{req.src}: quantized with {quantized.quant.label}: convert would copy packed integers "
                         "no model class loads; add --dequantize (with --dtype bf16|fp16|fp32) for a "
                         "full-precision copy; nothing written")
    return quantized


def _param_counts(outputs: list[OutputTensor]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in outputs:
        n = 1
        for d in t.shape:
            n *= d
        counts[t.dtype] = counts.get(t.dtype, 0) + n
    return counts


def _output_figures(outputs: list[OutputTensor], source: SourceModel, shards: int, verified: int) -> dict[str, Any]:
    dtypes_out: dict[str, int] = {}
    casts: dict[str, int] = {}
    for t in outputs:
        dtypes_out[t.dtype] = dtypes_out.get(t.dtype, 0) + 1
        if t.dtype != t.mapped.source.info.dtype:
            key = f"{t.mapped.source.info.dtype}->{t.dtype}"
            casts[key] = casts.get(key, 0) + 1
    return {
        "tensors_out": len(outputs), "shards_out": shards, "dtypes_out": dict(sorted(dtypes_out.items())),
        "casts": casts, "parameters": sum(_param_counts(outputs).values()),
        "bytes_in": sum(os.path.getsize(f) for f in source.files),
        "bytes_out": sum(t.nbytes for t in outputs), "verified": verified,
    }
