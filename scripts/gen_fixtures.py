#!/usr/bin/env python3
"""Reference fixtures for minitrain's GPT-2, from an independent float64 PyTorch implementation.

The model is written out here with plain torch ops (no nn.Module, no library GPT-2), so that the
C++ model and this script only share the definition of GPT-2, not code:
  pre-LN blocks  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
  learned position embeddings, final ln_f, unembedding tied to wte (logits = ln_f(x) @ wte^T)
  LayerNorm with eps 1e-5 and biased variance
  causal self-attention, scores scaled by 1/sqrt(head_dim), [q | k | v] split of c_attn's output
  GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (Hendrycks & Gimpel 2016)
  linear layers with bias, weights stored (in, out) as Hugging Face's Conv1D stores them
  loss: mean cross-entropy over targets >= 0 (targets of -1 are ignored)

Weights are drawn in float64, rounded to float32, and the reference is computed in float64 from the
rounded values, so a float32 implementation loading the stored weights computes the same function.
Results (logits, loss, gradients) are stored as F32. The tied wte's gradient is the sum of its use
as the token embedding and as the unembedding.

Two files are written:
  gpt2_tiny.safetensors          plain causal attention, positions 0..T-1
  gpt2_tiny_docmask.safetensors  each row packs 2-3 documents: "doc_ids" says which, "positions"
                                 restart at 0 at each document start, attention is causal within a
                                 document only
Both hold the weights, "inputs"/"targets" (I32, (B,T)), "logits" (B,T,V), "loss" (1,) and
"grad.<weight name>" for every weight, plus the config as JSON metadata.

Usage: /usr/bin/python3 scripts/gen_fixtures.py --out tests/fixtures
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch

CONFIG = {
    "vocab_size": 97,  # deliberately not a multiple of 128: the C++ model pads V and must ignore the padding
    "n_embd": 32,
    "n_head": 4,
    "n_layer": 2,
    "block_size": 16,
    "layer_norm_eps": 1e-5,
}
BATCH, SEQ = 2, 12
SEED = 20240611
N_IGNORED = 2  # targets set to -1


def weight_shapes(cfg):
    """(name, shape, kind) in Hugging Face GPT-2 naming and orientation."""
    V, C, L, P = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"], cfg["block_size"]
    out = [("transformer.wte.weight", (V, C), "embed"), ("transformer.wpe.weight", (P, C), "embed")]
    for i in range(L):
        h = f"transformer.h.{i}."
        out += [
            (h + "ln_1.weight", (C,), "ln_w"), (h + "ln_1.bias", (C,), "bias"),
            (h + "attn.c_attn.weight", (C, 3 * C), "lin"), (h + "attn.c_attn.bias", (3 * C,), "bias"),
            (h + "attn.c_proj.weight", (C, C), "lin"), (h + "attn.c_proj.bias", (C,), "bias"),
            (h + "ln_2.weight", (C,), "ln_w"), (h + "ln_2.bias", (C,), "bias"),
            (h + "mlp.c_fc.weight", (C, 4 * C), "lin"), (h + "mlp.c_fc.bias", (4 * C,), "bias"),
            (h + "mlp.c_proj.weight", (4 * C, C), "lin"), (h + "mlp.c_proj.bias", (C,), "bias"),
        ]
    out += [("transformer.ln_f.weight", (C,), "ln_w"), ("transformer.ln_f.bias", (C,), "bias")]
    return out


def make_weights(cfg, gen):
    # Scales are larger than GPT-2's 0.02 on purpose: attention is then far from uniform, logits far
    # from flat, and biases and LayerNorm affines non-trivial, so a wrong term shows in every output.
    # Linear weights use std 1.2/sqrt(fan_in).
    weights = {}
    for name, shape, kind in weight_shapes(cfg):
        z = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "embed":
            w = 0.3 * z
        elif kind == "lin":
            w = (1.2 / math.sqrt(shape[0])) * z
        elif kind == "ln_w":
            w = 1.0 + 0.2 * z
        else:
            w = 0.1 * z
        weights[name] = w.float().double()  # exactly representable in float32
    return weights


def layernorm(x, w, b, eps):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(h, w_attn, b_attn, w_proj, b_proj, allowed, n_head):
    Bn, Tn, C = h.shape
    hs = C // n_head
    qkv = h @ w_attn + b_attn  # (B,T,3C) = [q | k | v]
    q, k, v = qkv.split(C, dim=-1)
    q, k, v = (t.reshape(Bn, Tn, n_head, hs).transpose(1, 2) for t in (q, k, v))  # (B,NH,T,hs)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    scores = scores.masked_fill(~allowed, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
    return y @ w_proj + b_proj


def forward(cfg, w, inputs, positions, doc_ids):
    """logits (B,T,V) in float64. doc_ids None means plain causal attention."""
    Tn = inputs.shape[1]
    eps = cfg["layer_norm_eps"]
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    allowed = causal.expand(inputs.shape[0], Tn, Tn)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, :, None] == doc_ids[:, None, :])
    allowed = allowed[:, None, :, :]  # broadcast over heads
    x = w["transformer.wte.weight"][inputs] + w["transformer.wpe.weight"][positions]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layernorm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        x = x + attention(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"], w[p + "attn.c_proj.weight"],
                          w[p + "attn.c_proj.bias"], allowed, cfg["n_head"])
        h = layernorm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_tanh(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + (h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"])
    x = layernorm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T


def mean_xent(logits, targets):
    keep = targets >= 0
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp[keep, targets[keep]]
    return -picked.mean()


def pack_documents(gen, rows, seq, docs_per_row):
    """doc_ids and positions for rows that each pack docs_per_row[r] documents."""
    doc_ids = torch.zeros(rows, seq, dtype=torch.int64)
    positions = torch.zeros(rows, seq, dtype=torch.int64)
    for r in range(rows):
        cuts = torch.randperm(seq - 1, generator=gen)[: docs_per_row[r] - 1] + 1
        starts = [0] + sorted(int(c) for c in cuts)
        for d, s in enumerate(starts):
            e = starts[d + 1] if d + 1 < len(starts) else seq
            doc_ids[r, s:e] = d
            positions[r, s:e] = torch.arange(e - s)
    return doc_ids, positions


def write_safetensors(path, tensors, metadata):
    """Writes the safetensors format: u64 header length, JSON header padded with spaces to a
    multiple of 8, then the tensors' bytes back to back in header order."""
    names = sorted(tensors)
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in names:
        dtype, arr = tensors[name]
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def f32(t):
    return ("F32", t.detach().numpy().astype("<f4"))


def i32(t):
    return ("I32", t.numpy().astype("<i4"))


def make_fixture(cfg, weights, inputs, targets, positions, doc_ids):
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    logits = forward(cfg, w, inputs, positions, doc_ids)
    loss = mean_xent(logits, targets)
    loss.backward()
    out = {name: f32(weights[name]) for name in weights}
    out.update({"grad." + name: f32(w[name].grad) for name in weights})
    out["inputs"] = i32(inputs)
    out["targets"] = i32(targets)
    out["logits"] = f32(logits)
    out["loss"] = f32(loss.reshape(1))
    if doc_ids is not None:
        out["doc_ids"] = i32(doc_ids)
        out["positions"] = i32(positions)
    return out, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for the .safetensors fixtures")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # fixed reduction order, so the output bytes are reproducible
    gen = torch.Generator().manual_seed(SEED)
    cfg = CONFIG
    weights = make_weights(cfg, gen)
    V = cfg["vocab_size"]
    inputs = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    ignored = torch.randperm(BATCH * SEQ, generator=gen)[:N_IGNORED]
    targets.view(-1)[ignored] = -1
    doc_ids, doc_positions = pack_documents(gen, BATCH, SEQ, [3, 2])
    plain_positions = torch.arange(SEQ).expand(BATCH, SEQ)

    note = ("Generated by scripts/gen_fixtures.py: independent float64 PyTorch GPT-2 (pre-LN, learned positions, "
            "tied wte/lm_head, GELU tanh approximation, LayerNorm eps 1e-5, attention scale 1/sqrt(head_dim)). "
            "Weights were rounded to fp32 before the float64 reference ran; results are stored as fp32. "
            "Names and (in, out) weight orientation follow Hugging Face GPT-2. loss is the mean cross-entropy "
            "over targets >= 0; grad.<name> is d loss / d <name>.")
    for fname, docs, pos in (("gpt2_tiny.safetensors", None, plain_positions),
                             ("gpt2_tiny_docmask.safetensors", doc_ids, doc_positions)):
        tensors, loss = make_fixture(cfg, weights, inputs, targets, pos, docs)
        meta_cfg = dict(cfg, batch=BATCH, seq=SEQ, seed=SEED, doc_masked=docs is not None)
        metadata = {"config": json.dumps(meta_cfg, sort_keys=True), "note": note,
                    "torch_version": torch.__version__}
        path = os.path.join(args.out, fname)
        write_safetensors(path, tensors, metadata)
        print(f"{path}: {len(tensors)} tensors, loss {loss:.6f}, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
