#!/opt/gradaccum/venv/bin/python
"""The PyPI package `gguf` (llama.cpp's own Python reader, writer and
dequantizer) as the reference for tests/formats/gguf_test.cpp.

Usage:
  gguf_reference.py synthetic DIR
      DIR/synthetic.gguf: written by gguf's GGUFWriter: metadata of every value type (arrays
      too), general.alignment 64, and tensors of types F32, F16, BF16, Q8_0, Q4_0, Q4_1
      (quantized by gguf.quants) and Q5_0 (a type gradaccum does not dequantize);
      DIR/synthetic.json: that file as GGUFReader reads it (see describe());
      DIR/synthetic.safetensors: gguf.quants.dequantize of each of its tensors but the Q5_0 one.
  gguf_reference.py metadata MODEL.gguf DIR
      DIR/model.json: MODEL as GGUFReader reads it (~3 s for SmolLM2-135M).
  gguf_reference.py tensors MODEL.gguf DIR
      DIR/model.json and DIR/model.safetensors: every tensor of MODEL dequantized (~6 s and
      540 MB for SmolLM2-135M).
"""

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file


def describe(reader):
    """Version, alignment, every metadata value with its type, every tensor's info."""
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the header, which the reader lists as fields too
            continue
        entry = {"type": field.types[0].name}
        if field.types[0] == GGUFValueType.ARRAY:
            entry["element"] = field.types[-1].name
        entry["value"] = field.contents()
        metadata[key] = entry
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in reversed(t.shape)],  # row-major, as the C++ reader gives it
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
        }
        for t in reader.tensors
    ]
    return {
        "version": int(reader.fields["GGUF.version"].contents()),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "metadata": metadata,
        "tensors": tensors,
    }


def write_reference(gguf_path, out_dir, stem, skip_types=(), tensors=True):
    reader = GGUFReader(gguf_path)
    (out_dir / f"{stem}.json").write_text(json.dumps(describe(reader), ensure_ascii=False), encoding="utf-8")
    if not tensors:
        return
    values = {
        t.name: np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        for t in reader.tensors
        if t.tensor_type not in skip_types
    }
    save_file(values, str(out_dir / f"{stem}.safetensors"))


def write_synthetic(path):
    rng = np.random.default_rng(53)
    w = GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -(2**62))
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "ünïcode ✓")
    w.add_key_value("test.empty_string", "", GGUFValueType.STRING)
    w.add_array("test.strings", ["a", "", "Ġthe", "ü"])
    w.add_key_value("test.u8s", [0, 7, 255], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    w.add_key_value("test.i16s", [-32768, 0, 32767], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT16)
    w.add_array("test.i32s", [-1, 2, 3])
    w.add_key_value("test.u64s", [1, 2**64 - 1], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT64)
    w.add_array("test.f32s", [0.5, -1.25, 3.0e-8])
    w.add_array("test.bools", [True, False])

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w.add_tensor("f32", f32(3, 5))
    w.add_tensor("f32_vector", f32(7))
    # float16 edge values: ±0, a subnormal, the largest, ±inf.
    special = np.array([0.0, -0.0, 6e-8, 65504.0, np.inf, -np.inf], dtype=np.float16)
    w.add_tensor("f16", np.concatenate([f32(18).astype(np.float16), special]).reshape(2, 3, 4))
    w.add_tensor("bf16", quantize(f32(4, 8), Q.BF16), raw_dtype=Q.BF16)
    w.add_tensor("q8_0", quantize(f32(3, 64), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("q4_0", quantize(f32(2, 96), Q.Q4_0), raw_dtype=Q.Q4_0)
    w.add_tensor("q4_1", quantize(f32(2, 2, 32) + 1.5, Q.Q4_1), raw_dtype=Q.Q4_1)
    w.add_tensor("q5_0", quantize(f32(1, 32), Q.Q5_0), raw_dtype=Q.Q5_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    mode = sys.argv[1]
    if mode == "synthetic":
        out_dir = Path(sys.argv[2])
        write_synthetic(out_dir / "synthetic.gguf")
        write_reference(out_dir / "synthetic.gguf", out_dir, "synthetic", skip_types=(Q.Q5_0,))
    elif mode in ("metadata", "tensors"):
        write_reference(sys.argv[2], Path(sys.argv[3]), "model", tensors=mode == "tensors")
    else:
        sys.exit(f"gguf_reference.py: unknown mode {mode!r}")


if __name__ == "__main__":
    main()
