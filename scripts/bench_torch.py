#!/usr/bin/env python3
"""PyTorch eager training-step benchmark of GPT-2: the peer that minitrain's `bench` is compared with.

The model is what a PyTorch user would write: nn.Embedding / nn.LayerNorm / nn.Linear, pre-LN blocks,
learned positions, GELU (tanh), unembedding tied to wte, fp32 throughout, AdamW, random tokens.
Attention uses torch.nn.functional.scaled_dot_product_attention(is_causal=True) where this PyTorch
has it (2.0 and later) and the plain masked-softmax formulation otherwise; the table says which.

FLOPs per token follow minitrain's convention (PaLM appendix B): 6 N_matmul + 12 L C T, where
N_matmul counts the matrices of the blocks and the tied unembedding once (real, unpadded vocabulary).

On a GPU the peer a user would run is mixed precision: --precision bf16 runs forward and loss under
torch.autocast(bfloat16) with fp32 weights and optimizer (as minitrain's precision=bf16 keeps fp32
masters), and --compile wraps the model in torch.compile (its compilation happens in the warm-up steps,
which are not timed). The last line, `result: ...`, is for scripts.

Usage: /usr/bin/python3 scripts/bench_torch.py --preset gpt2 --batch 4 --seq 256 --steps 3 --warmup 1 --threads 2
       python3 scripts/bench_torch.py --device cuda --precision bf16 --compile --batch 16 --seq 1024
"""
import contextlib
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The same presets as minitrain's model config (model/config.cpp). A mixture preset replaces the MLP
# of every `every`-th layer (layers every-1, 2 every-1, ...) by `experts` MLPs and a router, top_k each.
PRESETS = {
    "tiny": dict(vocab_size=512, block_size=128, n_layer=4, n_head=4, n_embd=128),
    "tiny-moe": dict(vocab_size=512, block_size=128, n_layer=4, n_head=4, n_embd=128, experts=4, top_k=2, every=2),
    "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt2-moe": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, experts=8, top_k=2, every=2),
    "gpt2-medium": dict(vocab_size=50257, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": dict(vocab_size=50257, block_size=1024, n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": dict(vocab_size=50257, block_size=1024, n_layer=48, n_head=25, n_embd=1600),
}
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def padded_vocab(v):
    # Padded to a multiple of 128 (50257 -> 50304), as minitrain pads it, so both run the same
    # classifier GEMM shape; the padded logits are sliced off before the loss, as minitrain ignores them.
    return (v + 127) // 128 * 128


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


# minitrain's moe defaults (model/config.h MoeConfig): dropless, load-balancing and z losses.
AUX_COEF, Z_COEF = 1e-2, 1e-3


class MoE(nn.Module):
    """A mixture layer as an eager PyTorch user writes it (the Mixtral block of Hugging Face's
    transformers, dropless): a bias-free router, softmax, top-k gates renormalised to sum to one
    (k > 1), each expert run on the rows that chose it and its weighted output added back with
    index_add_. Adds the Switch Transformer balance loss and the ST-MoE z-loss to `self.aux`."""

    def __init__(self, C, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(C, experts, bias=False)
        self.experts = nn.ModuleList(MLP(C) for _ in range(experts))
        self.aux = None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        probs = logits.softmax(dim=-1)
        gate, chosen = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(x[rows]) * gate[rows, slot, None])
        E = len(self.experts)
        share = F.one_hot(chosen, E).float().sum(dim=(0, 1)) / chosen.numel()  # f_i: a count, no gradient
        balance = E * (share * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        self.aux = AUX_COEF * balance + Z_COEF * z
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(self, C, n_head, block_size, moe=None):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MoE(C, *moe) if moe else MLP(C)
        if not HAVE_SDPA:
            mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
            self.register_buffer("causal", mask, persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            att = att.masked_fill(~self.causal[:T, :T], float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.vocab = cfg["vocab_size"]
        C = cfg["n_embd"]
        self.wte = nn.Embedding(padded_vocab(self.vocab), C)
        self.wpe = nn.Embedding(cfg["block_size"], C)
        moe = (cfg["experts"], cfg["top_k"]) if "experts" in cfg else None
        self.blocks = nn.ModuleList(Block(C, cfg["n_head"], cfg["block_size"], moe if is_moe_layer(cfg, l) else None)
                                    for l in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else nn.init.zeros_(p)
        for blk in self.blocks:
            for ln in (blk.ln_1, blk.ln_2):
                nn.init.ones_(ln.weight)
        nn.init.ones_(self.ln_f.weight)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied unembedding, (B, T, Vp)
        logits = logits[..., : self.vocab]
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
        for blk in self.blocks:
            if isinstance(blk.mlp, MoE):
                loss = loss + blk.mlp.aux
        return loss


def is_moe_layer(cfg, layer):
    return "experts" in cfg and (layer + 1) % cfg["every"] == 0


def moe_layers(cfg):
    return sum(is_moe_layer(cfg, l) for l in range(cfg["n_layer"]))


def param_count(cfg):
    """Parameters with the unpadded vocabulary and the tied embedding counted once (as HF reports), every
    expert counted (model/config.cpp num_params)."""
    V, P, L, C = cfg["vocab_size"], cfg["block_size"], cfg["n_layer"], cfg["n_embd"]
    mlp = 8 * C * C + 5 * C
    moe_extra = cfg["experts"] * C + (cfg["experts"] - 1) * mlp if "experts" in cfg else 0
    return V * C + P * C + L * (12 * C * C + 13 * C) + moe_layers(cfg) * moe_extra + 2 * C


def flops_per_token(cfg, T):
    """minitrain's model FLOPs (model/config.cpp): a mixture layer adds its router and the MLPs of the
    top_k - 1 further experts a token uses."""
    C = cfg["n_embd"]
    moe_extra = cfg["experts"] * C + (cfg["top_k"] - 1) * 8 * C * C if "experts" in cfg else 0
    n_matmul = cfg["n_layer"] * 12 * C ** 2 + moe_layers(cfg) * moe_extra + cfg["vocab_size"] * C
    return 6.0 * n_matmul + 12.0 * cfg["n_layer"] * C * T


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 training-step benchmark (AdamW; eager or compiled, fp32 or bf16 autocast)")
    ap.add_argument("--preset", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (B)")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence (T), at most the block size")
    ap.add_argument("--steps", type=int, default=10, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps before them")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: forward and loss under torch.autocast(bfloat16), fp32 weights and AdamW")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (compiled during warm-up)")
    args = ap.parse_args()
    cfg = PRESETS[args.preset]
    for flag, val, lo in (("--batch", args.batch, 1), ("--seq", args.seq, 1), ("--steps", args.steps, 1),
                          ("--warmup", args.warmup, 0), ("--threads", args.threads, 0)):
        if val < lo:
            sys.exit(f"bench_torch.py: {flag} must be >= {lo} (got {val})")
    if args.seq > cfg["block_size"]:
        sys.exit(f"bench_torch.py: --seq {args.seq} exceeds the block size {cfg['block_size']} of '{args.preset}'")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_torch.py: --device cuda but PyTorch sees no CUDA device")
    if args.compile and args.warmup < 1:
        sys.exit("bench_torch.py: --compile needs --warmup >= 1 (the compilation must not be timed)")
    if args.compile and not hasattr(torch, "compile"):
        sys.exit(f"bench_torch.py: --compile: PyTorch {torch.__version__} has no torch.compile (2.0 and later)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    step_model = torch.compile(model) if args.compile else model
    autocast = (lambda: torch.autocast(device_type=args.device, dtype=torch.bfloat16)) if args.precision == "bf16" \
        else contextlib.nullcontext
    B, T, V = args.batch, args.seq, cfg["vocab_size"]
    times, loss = [], float("nan")
    wall0 = time.perf_counter()
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, V, (B, T + 1), device=dev)
        sync()
        t0 = time.perf_counter()
        with autocast():
            out = step_model(tokens[:, :-1], tokens[:, 1:])
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.item()  # also waits for the step on an accelerator
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - wall0

    med = statistics.median(times)
    tok_s = B * T / med
    attn = "sdpa" if HAVE_SDPA else "masked softmax (no sdpa in this PyTorch)"
    where = f"{torch.get_num_threads()} threads" if args.device == "cpu" else torch.cuda.get_device_name()
    mode = "torch.compile" if args.compile else "eager"
    prec = "bf16 autocast, fp32 weights" if args.precision == "bf16" else "fp32"
    print(f"PyTorch {torch.__version__} {mode}, {prec}, {args.device} ({where}), attention: {attn}")
    print(f"vocab {V} padded to {padded_vocab(V)}; FLOPs/token = 6 N_matmul + 12 L C T = "
          f"{flops_per_token(cfg, T) / 1e6:.1f} MFLOP")
    hdr = f"{'config':<12} {'params':>10} {'B':>4} {'T':>5} {'steps':>5} {'ms/step':>10} {'tokens/s':>10} " \
          f"{'TFLOP/s':>8} {'loss':>7}"
    print(hdr)
    print("-" * len(hdr))
    print(f"{args.preset:<12} {param_count(cfg) / 1e6:>9.2f}M {B:>4} {T:>5} {len(times):>5} {med * 1e3:>10.1f} "
          f"{tok_s:>10.1f} {flops_per_token(cfg, T) * tok_s / 1e12:>8.4f} {loss:>7.3f}")
    print(f"(medians over {len(times)} measured steps after {args.warmup} warmup; min {min(times) * 1e3:.1f} ms, "
          f"max {max(times) * 1e3:.1f} ms; wall {wall:.1f} s)")
    print(f"result: {mode} {args.precision} ms/step {med * 1e3:.1f} tokens/s {tok_s:.1f} "
          f"TFLOP/s {flops_per_token(cfg, T) * tok_s / 1e12:.2f}")


if __name__ == "__main__":
    main()
