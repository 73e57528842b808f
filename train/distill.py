"""Distil a small Llama draft from SmolLM2-135M-Instruct (GGUF teacher) on one GPU, in one run.

usage: python3 train/distill.py --teacher TARGET.gguf --out RUN_DIR [--gen_batches N] [--steps N] ...
(run from the repository root; train/README.md has the commands that made the shipped draft)

Stages: load the teacher from its GGUF -> sanity check (greedy "Paris", KV-cache decoding ==
recomputation) -> the teacher samples --gen_batches batches of --gen_batch continuations of the
training prompts -> the student (PCA-initialised embedding, or --init_from / --init_gguf) trains
--steps steps on KL(p_teacher || q_student) + TV over full next-token distributions, teacher run
online -> held-out eval (1 - TV at T = 0.7, greedy agreement) -> fp16 weights (files under 16 MiB)
and reference logits for export_gguf.py's check, results.json, token_counts.npy.
"""
import argparse, json, math, os, sys, time

T0 = time.time()
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EOS = 2  # <|im_end|>


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------------------- model
class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()


def rope_i(x, cos, sin):
    """Interleaved RoPE (llama.cpp 'normal' mode): rotate adjacent pairs (x[2i], x[2i+1])."""
    x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
    o = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).flatten(-2)
    return o.to(x.dtype)


class Block(nn.Module):
    def __init__(self, d, H, KV, ffn, eps):
        super().__init__()
        hd = d // H
        self.H, self.KV, self.hd = H, KV, hd
        self.attn_norm = RMSNorm(d, eps)
        self.attn_q = nn.Linear(d, H * hd, bias=False)
        self.attn_k = nn.Linear(d, KV * hd, bias=False)
        self.attn_v = nn.Linear(d, KV * hd, bias=False)
        self.attn_output = nn.Linear(H * hd, d, bias=False)
        self.ffn_norm = RMSNorm(d, eps)
        self.ffn_gate = nn.Linear(d, ffn, bias=False)
        self.ffn_up = nn.Linear(d, ffn, bias=False)
        self.ffn_down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin, cache, cache_pos, mask):
        B, T, _ = x.shape
        H, KV, hd = self.H, self.KV, self.hd
        h = self.attn_norm(x)
        q = self.attn_q(h).view(B, T, H, hd).transpose(1, 2)
        k = self.attn_k(h).view(B, T, KV, hd).transpose(1, 2)
        v = self.attn_v(h).view(B, T, KV, hd).transpose(1, 2)
        q, k = rope_i(q, cos, sin), rope_i(k, cos, sin)
        if cache is not None:
            kc, vc = cache
            kc[:, :, cache_pos:cache_pos + T] = k
            vc[:, :, cache_pos:cache_pos + T] = v
            k, v = kc[:, :, :cache_pos + T], vc[:, :, :cache_pos + T]
        v = v.to(q.dtype)
        k = k.to(q.dtype)
        if H != KV:
            k = k.repeat_interleave(H // KV, 1)
            v = v.repeat_interleave(H // KV, 1)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.attn_output(o.transpose(1, 2).reshape(B, T, H * hd))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class Llama(nn.Module):
    def __init__(self, vocab, d, n_layers, n_heads, n_kv, ffn, eps, theta):
        super().__init__()
        self.cfg = dict(vocab=vocab, d=d, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, ffn=ffn, eps=eps, theta=theta)
        self.hd = d // n_heads
        self.token_embd = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d, n_heads, n_kv, ffn, eps) for _ in range(n_layers)])
        self.output_norm = RMSNorm(d, eps)
        inv = theta ** (-torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def forward(self, ids, pos=None, caches=None, cache_pos=0, mask=None, last_only=False):
        B, T = ids.shape
        if pos is None:
            pos = torch.arange(T, device=ids.device)[None]
        ang = pos[..., None].float() * self.inv_freq  # [B|1, T, hd/2]
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        x = self.token_embd(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], cache_pos, mask)
        if last_only:
            x = x[:, -1:]
        x = self.output_norm(x)
        return F.linear(x, self.token_embd.weight)

    def gguf_state(self):
        """{gguf tensor name: tensor} (llama.cpp names, PyTorch [out, in] layout)."""
        return {k.replace("layers.", "blk."): v for k, v in self.state_dict().items()}

    def load_gguf_state(self, w):
        sd = {k: torch.from_numpy(w[k.replace("layers.", "blk.")]) for k in self.state_dict()}
        self.load_state_dict(sd)


# ------------------------------------------------------------------------------------ generation
@torch.no_grad()
def generate(model, prompts, max_new, temperature, gen=None, amp=True):
    """Batched sampling with a KV cache over left-padded prompts. Returns list of token lists
    (each up to and including the first <|im_end|>)."""
    dev = model.inv_freq.device
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, P), EOS, dtype=torch.long)
    pad = torch.zeros(B, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
        pad[b] = P - len(p)
    ids, pad = ids.to(dev), pad.to(dev)
    S = P + max_new
    c = model.cfg
    cdt = torch.bfloat16 if amp else torch.float32
    caches = [(torch.zeros(B, c["n_kv"], S, model.hd, dtype=cdt, device=dev),
               torch.zeros(B, c["n_kv"], S, model.hd, dtype=cdt, device=dev)) for _ in range(c["n_layers"])]
    ar = torch.arange(S, device=dev)
    qi = ar[:P]
    pos = (qi[None, :] - pad[:, None]).clamp(min=0)
    valid = (ar[None, None, :P] <= qi[None, :, None]) & (
        (ar[None, None, :P] >= pad[:, None, None]) | (ar[None, None, :P] == qi[None, :, None]))
    mask = valid[:, None]  # [B,1,P,P]
    out = torch.full((B, max_new), EOS, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        logits = model(ids, pos, caches, 0, mask, last_only=True)
        n = 0
        for t in range(max_new):
            lg = logits[:, -1].float()
            if temperature <= 0:
                nxt = lg.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(lg / temperature, -1), 1, generator=gen).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, EOS), nxt)
            out[:, t] = nxt
            n = t + 1
            done |= nxt == EOS
            if t == max_new - 1 or (t % 16 == 15 and bool(done.all())):
                break
            cp = P + t
            pos = (cp - pad).clamp(min=0)[:, None]
            mask = (ar[None, :cp + 1] >= pad[:, None])[:, None, None, :]
            logits = model(nxt[:, None], pos, caches, cp, mask, last_only=True)
    res = []
    for row in out[:, :n].tolist():
        res.append(row[:row.index(EOS) + 1] if EOS in row else row)
    return res


# ------------------------------------------------------------------------------------ metrics
@torch.no_grad()
def eval_pairs(student, teacher, samples, cats, temp=0.7):
    """samples: [(cat, prompt_ids, resp_ids)]. Teacher-forced over prompt+resp; metrics on the
    positions that predict response tokens."""
    acc = {c: [0.0, 0, 0] for c in cats}  # sum(1-TV), n positions, greedy agreements
    for cat, p, r in samples:
        seq = torch.tensor(p + r, device=student.inv_freq.device)[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lt = teacher(seq)[0].float()
            ls = student(seq)[0].float()
        sl = slice(len(p) - 1, len(p) + len(r) - 1)
        pt, ps = torch.softmax(lt[sl] / temp, -1), torch.softmax(ls[sl] / temp, -1)
        one_m_tv = 1 - 0.5 * (pt - ps).abs().sum(-1)
        agree = (lt[sl].argmax(-1) == ls[sl].argmax(-1))
        a = acc[cats[cat]]
        a[0] += one_m_tv.sum().item(); a[1] += len(r); a[2] += agree.sum().item()
    tab = {c: {"one_minus_tv": a[0] / max(a[1], 1), "greedy_agree": a[2] / max(a[1], 1), "positions": a[1]}
           for c, a in acc.items()}
    S, N, G = (sum(a[i] for a in acc.values()) for i in range(3))
    tab["overall"] = {"one_minus_tv": S / max(N, 1), "greedy_agree": G / max(N, 1), "positions": N}
    return tab


def fmt_tab(tab):
    return " | ".join(f"{k}: 1-TV {v['one_minus_tv']:.3f} agree {v['greedy_agree']:.3f} (n={v['positions']})"
                      for k, v in tab.items())


def grow(ws, n_old, n_new, fresh):
    """Insert n_new - n_old layers evenly between the loaded ones (after every n_old/(n_new-n_old)).
    A new layer takes the fresh initialisation from `fresh` except its two output projections,
    which are zero: its residual branches add nothing, so the grown model is the loaded one."""
    m = n_new - n_old
    order = []  # for each new index: ("old", i) or ("new", None)
    for j in range(n_old):
        order.append(j)
        if (j + 1) * m // n_old > j * m // n_old:
            order.append(None)
    assert len(order) == n_new, (len(order), n_new)
    out = {k: v for k, v in ws.items() if not k.startswith("blk.")}
    for i, src in enumerate(order):
        pre = f"blk.{i}."
        for k, v in fresh.items():
            if not k.startswith(pre):
                continue
            name = k[len(pre):]
            if src is not None:
                out[k] = ws[f"blk.{src}.{name}"]
            elif name in ("attn_output.weight", "ffn_down.weight"):
                out[k] = np.zeros(tuple(v.shape), dtype=np.float32)
            else:
                out[k] = v.detach().float().cpu().numpy()
    log("grown layer order (old index or new):", ["new" if s is None else s for s in order])
    return out


def prompt_probs(train_prompts, cats, cat_weight):
    """Sampling probabilities of the listed prompts: uniform, times the weight of each category
    named in `cat_weight` ("code=3,qa=0.5"; the others weigh 1)."""
    w = {c: 1.0 for c in cats}
    for part in filter(None, (cat_weight or "").split(",")):
        name, _, value = part.partition("=")
        if name not in w:
            raise SystemExit(f"--cat_weight: unknown category {name!r} (known: {', '.join(cats)})")
        w[name] = float(value)
    p = np.array([w[cats[c]] for c, _ in train_prompts], dtype=np.float64)
    return p / p.sum()


def teacher_data(teacher, inp, args, gen, vocab, results):
    """Teacher continuations of the training prompts (and of prompts it writes itself), args.gen_batches
    batches of args.gen_batch; returns (data, wdata, nchunk): token windows [nchunk, seq] on the GPU and
    their loss weights (1 where the position predicts a response token)."""
    dev = teacher.inv_freq.device
    # ---- training data: teacher continuations of the training prompts
    train_prompts = inp["train"]
    rng = np.random.default_rng(args.seed)
    if args.gen_seed:
        rng = np.random.default_rng(args.seed + 1000 * args.gen_seed)
        gen.manual_seed(args.seed + 1000 * args.gen_seed)
    temps = [0.7, 0.85, 1.0]
    listed_p = prompt_probs(train_prompts, inp["cats"], args.cat_weight)
    docs, ntok, nb, n_self = [], 0, 0, 0
    self_examples = []
    while nb < args.gen_batches:
        temp = temps[nb % len(temps)]
        tb, kind, ps = time.time(), "listed", []
        if rng.random() < args.self_prompts:
            # the teacher writes the user turn itself (after a random opener), at T=1 for variety
            heads = [inp["self_head"] + inp["self_openers"][i]
                     for i in rng.integers(0, len(inp["self_openers"]), size=args.gen_batch)]
            turns = generate(teacher, heads, 48, 1.0, gen)
            ps = [h + t[:-1] + inp["self_tail"] for h, t in zip(heads, turns) if len(t) >= 4 and t[-1] == EOS]
            n_self += len(ps)
            if len(self_examples) < 24:
                self_examples += ps[:8]
            kind = "self"
        if kind != "self" or not ps:  # (a random smoke-test teacher rarely ends its user turn)
            idx = rng.choice(len(train_prompts), size=min(args.gen_batch, len(train_prompts)), replace=False,
                             p=listed_p)
            ps = [train_prompts[i][1] for i in idx]
            kind = "listed"
        rs = generate(teacher, ps, args.max_new, temp, gen)
        for p, r in zip(ps, rs):
            resp = r + ([inp["newline_id"][0]] if r and r[-1] == EOS else [])
            docs.append((p, resp)); ntok += len(p) + len(resp)
        nb += 1
        log(f"gen batch {nb} ({kind} prompts, {len(ps)}) T={temp} ({time.time() - tb:.1f}s): {len(docs)} docs, "
            f"{ntok} tokens, mean resp {np.mean([len(r) for r in rs]):.0f}, "
            f"eos rate {np.mean([r[-1] == EOS for r in rs]):.2f}")
    results["self_prompt_examples"] = self_examples
    order = rng.permutation(len(docs))
    stream = np.concatenate([np.asarray(docs[i][0] + docs[i][1], dtype=np.int64) for i in order])
    # resp[j] = 1 where token j is part of a response; position j predicts token j+1
    resp = np.concatenate([np.r_[np.zeros(len(docs[i][0])), np.ones(len(docs[i][1]))] for i in order])
    weight = np.roll(resp, -1) * (1 - args.prompt_weight) + args.prompt_weight
    # how often each token is sampled in the responses (for a draft head restricted to frequent tokens)
    counts = np.bincount(stream[resp > 0], minlength=vocab)
    if args.data_from:
        old = np.load(args.data_from)
        log(f"prepending {len(old['tokens'])} tokens from {args.data_from}")
        stream = np.concatenate([old["tokens"].astype(np.int64), stream])
        weight = np.concatenate([old["weights"].astype(np.float64), weight])
        counts = counts + old["counts"]
    np.save(os.path.join(args.out, "token_counts.npy"), counts)
    if args.data_keep:
        np.savez(args.data_keep, tokens=stream.astype(np.uint16), weights=weight.astype(np.float16), counts=counts)
    nchunk = len(stream) // args.seq
    data = torch.from_numpy(stream[:nchunk * args.seq].reshape(nchunk, args.seq)).to(dev)
    wdata = torch.from_numpy(weight[:nchunk * args.seq].reshape(nchunk, args.seq).astype(np.float32)).to(dev)
    log(f"self-written prompts: {n_self}; positions with loss weight 1: {weight.mean():.3f}")
    results["data"] = {"docs": len(docs), "tokens": int(len(stream)), "chunks": nchunk, "gen_batches": nb}
    log(f"data: {len(docs)} docs, {len(stream)} tokens, {nchunk} chunks of {args.seq}")

    return data, wdata, nchunk


def run_args(lr, warmup, steps):
    """An argument parser with what every run here takes: inputs and sizes, the teacher's data,
    optimisation, and the loss (KL + TV); each script adds its model's own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", help="the target GGUF (SmolLM2-135M-Instruct.Q4_1.gguf); not needed with --smoke")
    ap.add_argument("--inputs", default="train/build/inputs.json", help="make_inputs.py's output")
    ap.add_argument("--out", required=True, help="folder for this run's weights, logs and results")
    ap.add_argument("--smoke", action="store_true",
                    help="random 2-layer teacher, tiny sizes: a test of every code path in about 30 s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gen_batches", type=int, default=8,
                    help="batches of teacher continuations to generate (each --gen_batch prompts)")
    ap.add_argument("--gen_batch", type=int, default=2048, help="prompts per generation batch")
    ap.add_argument("--steps", type=int, default=steps, help="optimizer steps (of --batch windows of --seq tokens)")
    ap.add_argument("--max_new", type=int, default=256)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--data_from", default=None,
                    help=".npz (tokens + loss weights) kept by an earlier run's --data_keep, prepended to new data")
    ap.add_argument("--data_keep", default=None, help="save this run's whole data (tokens + loss weights) here, .npz")
    ap.add_argument("--gen_seed", type=int, default=0, help="if nonzero: reseed training-data sampling (new data)")
    ap.add_argument("--self_prompts", type=float, default=0.5,
                    help="fraction of generation batches whose user turn the teacher writes itself after an opener")
    ap.add_argument("--prompt_weight", type=float, default=0.0,
                    help="loss weight of positions that predict prompt tokens (response positions weigh 1)")
    ap.add_argument("--tv_weight", type=float, default=1.0,
                    help="weight of TV(p,q) at --tv_temp added to KL(p||q) at T=1 (TV = 1 - acceptance rate)")
    ap.add_argument("--tv_temp", type=float, default=0.7)
    ap.add_argument("--cat_weight", default="",
                    help='sampling weight of listed prompts by category, e.g. "code=3" (others weigh 1)')
    return ap


def set_lr(opt, args, step):
    """Linear warmup over args.warmup steps, then cosine down to 10% of args.lr at args.steps."""
    lr = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
    lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(args.steps, 1))))
    for gp in opt.param_groups:
        gp["lr"] = lr
    return lr


def batches(data, wdata, nchunk, batch, dev):
    """Endless random batches of token windows and their loss weights, each window once per pass."""
    while True:
        perm = torch.randperm(nchunk, device=dev)
        for pi in range(0, max(nchunk - batch, 0) + 1, batch):
            yield data[perm[pi:pi + batch]], wdata[perm[pi:pi + batch]]


def start_run(args):
    """Seeds, the output folder, the prepared inputs, and a results dict with its saver."""
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    log("torch", torch.__version__, torch.cuda.get_device_name(0), vars(args))
    inp = json.load(open(args.inputs))
    results = {"args": vars(args)}

    def save_results():
        json.dump(results, open(os.path.join(args.out, "results.json"), "w"))

    return inp, results, save_results


def load_teacher(args, dev):
    """The frozen teacher from args.teacher (GGUF), or with --smoke a random 2-layer one of the same
    widths (and tiny run sizes set on args). Returns (config, model)."""
    if args.smoke:
        tcfg = dict(vocab=49152, d=576, n_layers=2, n_heads=9, n_kv=3, ffn=1536, eps=1e-5, theta=100000.0)
        teacher = Llama(**tcfg)
        for n_, p_ in teacher.named_parameters():
            if p_.dim() == 2:
                nn.init.normal_(p_, std=0.05 if "token_embd" in n_ else 0.02)
        args.gen_batches, args.gen_batch, args.max_new, args.seq, args.batch = 2, 64, 24, 256, 4
        args.steps = min(args.steps, 6)
    else:
        if not args.teacher:
            raise SystemExit("--teacher TARGET.gguf is needed (or --smoke)")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gguf_io import load_weights
        tcfg, w = load_weights(args.teacher)
        log("teacher cfg", tcfg)
        teacher = Llama(**tcfg)
        teacher.load_gguf_state(w)
        del w
    teacher = teacher.to(dev).eval().requires_grad_(False)
    log("teacher loaded, params", sum(p.numel() for p in teacher.parameters()))
    return tcfg, teacher


def save_f16(state, out, prefix, meta):
    """Tensors as fp16 in files of 14 MiB (<prefix>_w<i>.f16, small enough to move and keep anywhere)
    plus <prefix>_index.json (meta, then name/shape/offset of each). Returns {name: fp16 array}."""
    st = {k: v.detach().to(torch.float16).cpu().numpy() for k, v in state.items()}
    index, flat, off = [], [], 0
    for k, v in st.items():
        index.append([k, list(v.shape), off]); off += v.size; flat.append(v.ravel())
    flat = np.concatenate(flat)
    chunk = 7 * 1024 * 1024  # fp16 elements -> 14 MiB per file
    nfiles = (len(flat) + chunk - 1) // chunk
    for i in range(nfiles):
        flat[i * chunk:(i + 1) * chunk].tofile(os.path.join(out, f"{prefix}_w{i}.f16"))
    json.dump({**meta, "index": index, "total": int(off), "chunk": chunk, "files": nfiles},
              open(os.path.join(out, f"{prefix}_index.json"), "w"))
    log(f"exported {off} params in {nfiles} files")
    return st


def load_f16(folder, prefix):
    """What save_f16 wrote: (index dict, {name: float32 array})."""
    ix = json.load(open(os.path.join(folder, f"{prefix}_index.json")))
    flat = np.concatenate([np.fromfile(os.path.join(folder, f"{prefix}_w{i}.f16"), dtype=np.float16)
                           for i in range(ix["files"])])
    return ix, {k: flat[o:o + int(np.prod(sh))].reshape(sh).astype(np.float32) for k, sh, o in ix["index"]}


# ---------------------------------------------------------------------------------------- main
def main():
    ap = run_args(lr=2e-3, warmup=150, steps=1500)
    ap.add_argument("--d", type=int, default=192, help="student width (the shipped draft: 192)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv", type=int, default=3)
    ap.add_argument("--ffn", type=int, default=640)
    ap.add_argument("--init_from", default=None,
                    help="dir with student_index.json + student_w*.f16 to continue from; if --layers is larger "
                         "than the loaded model's, new layers are inserted evenly with zero output projections "
                         "(the grown model computes exactly what the loaded one did)")
    ap.add_argument("--init_gguf", default=None, help="a draft GGUF (export_gguf.py's) to continue from")
    args = ap.parse_args()
    dev = "cuda"
    inp, results, save_results = start_run(args)
    cats = inp["cats"]
    tcfg, teacher = load_teacher(args, dev)

    # ---- sanity: greedy Paris, and KV-cache decoding == full recomputation
    g = generate(teacher, [inp["sanity"]], 12, 0.0, amp=False)[0]  # fp32: bf16 flips a 0.08-logit near-tie
    log("sanity greedy ids", g)
    results["sanity_ids"] = g
    if not args.smoke and 7042 not in g:
        log("SANITY FAILED: ' Paris' (7042) not generated"); save_results(); sys.exit(2)
    probe = [p for _, p in inp["eval"][:6]]
    gg = generate(teacher, probe, 20, 0.0)
    match = tot = 0
    for p, r in zip(probe, gg):
        seq = torch.tensor(p + r, device=dev)[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            am = teacher(seq)[0].argmax(-1).tolist()
        pred = am[len(p) - 1:len(p) + len(r) - 1]
        match += sum(int(a == b) for a, b in zip(pred, r)); tot += len(r)
    log(f"cache-vs-recompute greedy match {match}/{tot}")
    results["cache_check"] = [match, tot]

    # ---- eval continuations (held-out prompts), teacher at T=0.7
    gen = torch.Generator(device=dev); gen.manual_seed(args.seed + 1)
    ev_prompts = [p for _, p in inp["eval"]]
    ev_resp = generate(teacher, ev_prompts, args.max_new, 0.7, gen)
    eval_samples = [(c, p, r) for (c, p), r in zip(inp["eval"], ev_resp)]
    results["eval_teacher_ids"] = ev_resp
    log("eval continuations", sum(len(r) for r in ev_resp), "tokens")

    data, wdata, nchunk = teacher_data(teacher, inp, args, gen, tcfg["vocab"], results)
    save_results()

    # ---- student
    scfg = dict(vocab=tcfg["vocab"], d=args.d, n_layers=args.layers, n_heads=args.heads, n_kv=args.kv,
                ffn=args.ffn, eps=tcfg["eps"], theta=tcfg["theta"])
    student = Llama(**scfg).to(dev)
    for n_, p_ in student.named_parameters():
        if p_.dim() == 2 and "token_embd" not in n_:
            std = 0.02 / math.sqrt(2 * args.layers) if ("attn_output" in n_ or "ffn_down" in n_) else 0.02
            nn.init.normal_(p_, std=std)
    if args.init_gguf:
        # a shipped draft (Q8_0, dequantized): same names and layout as the teacher's GGUF
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gguf_io import load_weights
        gcfg, ws = load_weights(args.init_gguf)
        names = student.gguf_state().keys()
        ws = {k: v for k, v in ws.items() if k in names}
        student.load_gguf_state(ws)
        log(f"student initialised from {args.init_gguf} ({gcfg})")
    elif args.init_from:
        ix, ws = load_f16(args.init_from, "student")
        n_old = ix["cfg"]["n_layers"]
        if args.layers > n_old:
            ws = grow(ws, n_old, args.layers, student.gguf_state())
        student.load_gguf_state(ws)
        log(f"student initialised from {args.init_from} ({n_old} -> {args.layers} layers)")
    else:
      with torch.no_grad():  # embedding: teacher embedding projected on its top-d principal directions
        E = teacher.token_embd.weight.float()
        evals, evecs = torch.linalg.eigh(E.T @ E)
        V = evecs[:, -args.d:].flip(-1)
        student.token_embd.weight.copy_(E @ V)
        log(f"PCA init: kept {evals[-args.d:].sum() / evals.sum():.3f} of embedding energy")
    nparam = sum(p.numel() for p in student.parameters())
    log("student cfg", scfg, "params", nparam)
    results["student_cfg"] = scfg; results["student_params"] = nparam
    tab0 = eval_pairs(student, teacher, eval_samples, cats)
    log("eval at init:", fmt_tab(tab0))
    results["eval_init"] = tab0

    decay = [p for p in student.parameters() if p.dim() == 2]
    nodecay = [p for p in student.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step, t_train0, losses = 0, time.time(), []
    stream = batches(data, wdata, nchunk, args.batch, dev)
    while step < args.steps:
        lr = set_lr(opt, args, step)
        x, wx = next(stream)
        sel = wx > 0
        wsel = wx[sel]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.no_grad():
                zt = teacher(x)[sel].float()
            zs = student(x)[sel].float()
        lt, ls = F.log_softmax(zt, -1), F.log_softmax(zs, -1)
        kl = (lt.exp() * (lt - ls)).sum(-1)
        loss = (kl * wsel).sum() / wsel.sum()
        if args.tv_weight > 0:
            tv = 0.5 * (torch.softmax(zt / args.tv_temp, -1) - torch.softmax(zs / args.tv_temp, -1)).abs().sum(-1)
            loss = loss + args.tv_weight * (tv * wsel).sum() / wsel.sum()
        del zt, zs
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        del lt, ls
        step += 1
        if step % 50 == 0 or step <= 3:
            losses.append((step, loss.item()))
            log(f"step {step} loss {loss.item():.4f} gnorm {gn.item():.2f} lr {lr:.2e} "
                f"tokens {step * args.batch * args.seq / 1e6:.1f}M")
    ttrain = time.time() - t_train0
    log(f"trained {step} steps in {ttrain:.0f}s ({step * args.batch * args.seq / 1e6:.1f}M tokens, "
        f"{step * args.batch * args.seq / max(nchunk * args.seq, 1):.1f} epochs)")
    results["train"] = {"steps": step, "seconds": ttrain, "tokens": step * args.batch * args.seq, "losses": losses}
    student.eval()

    # ---- export fp16 weights right away (split < 16 MiB)
    st = save_f16(student.gguf_state(), args.out, "student", {"cfg": scfg})

    # ---- reference logits: fp32 forward with the fp16-rounded weights
    with torch.no_grad():
        ref_model = Llama(**scfg).to(dev)
        ref_model.load_gguf_state({k: v.astype(np.float32) for k, v in st.items()})
        ref_ids = (eval_samples[0][1] + eval_samples[0][2])[:48]
        ref_logits = ref_model(torch.tensor(ref_ids, device=dev)[None])[0].float().cpu().numpy()
    np.savez(os.path.join(args.out, "ref_logits.npz"), ids=np.asarray(ref_ids), logits=ref_logits[-8:],
             positions=np.arange(len(ref_ids) - 8, len(ref_ids)))
    del ref_model

    # ---- eval
    tab = eval_pairs(student, teacher, eval_samples, cats)
    log("EVAL T=0.7:", fmt_tab(tab))
    results["eval"] = tab
    tab1 = eval_pairs(student, teacher, eval_samples, cats, temp=1.0)
    log("eval T=1.0:", fmt_tab(tab1))
    results["eval_t1"] = tab1
    save_results()
    sel = [i for c in range(len(cats)) for i in [j for j, s in enumerate(eval_samples) if s[0] == c][:2]]
    gen.manual_seed(args.seed + 2)
    sres = generate(student, [eval_samples[i][1] for i in sel], 160, 0.7, gen)
    results["student_samples"] = [[i, r] for i, r in zip(sel, sres)]
    results["total_seconds"] = time.time() - T0
    save_results()
    log("done")


if __name__ == "__main__":
    main()
