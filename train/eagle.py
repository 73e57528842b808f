"""Train a feature draft ("EAGLE"-style head) for SmolLM2-135M-Instruct on one GPU, in one run.

usage: python3 train/eagle.py --teacher TARGET.gguf --out RUN_DIR --taps 2,14 [--gen_batches N] [--steps N] ...
(run from the repository root; train/README.md has the commands that made the shipped feature draft)

Independent drafts of 13-19 M parameters land at about 0.58 held-out 1 - TV whatever their shape:
what they lack is the target's knowledge. A feature draft reads the target's own last
hidden state instead. At position t it takes the target's final (post-norm) feature f_t and the
embedding of the token x_{t+1} that follows, and predicts f_{t+1}; the target's output head turns the
prediction into the draft distribution q for x_{t+2}:

    h = fc([embed(x_{t+1}), f_t])            fc: 2d -> d, no bias
    h = LlamaBlock(h)                        one block of the target's shape (--blocks: more)
    f^_{t+1} = RMSNorm(h);  q = softmax(head(f^_{t+1}) / T)

Drafting k tokens chains it: after the first step the input feature is its own prediction. Training
unrolls --unroll steps, two by default ("training-time test"): pass 1 reads the target's features,
pass 2 reads pass 1's predictions, and so on, each scored (KL at T=1 + TV at T=0.7 against the
target's distributions, plus a smooth-L1 pull of pass 1's features towards the target's). The block
starts random (or as the target's last block with --init_last_block 1, or from an earlier run with
--init_from or an exported file with --init_gguf); embedding and
head are the target's, frozen, and not part of the exported file (Mentor Lab lends them at load).
--taps 2,14 adds the target's residual streams after those blocks to the feature (the shipped draft's
setting), mixed in by a zero-initialised matrix.

Eval on the 40 held-out prompts' teacher continuations: 1 - TV at T=0.7 and greedy agreement for
step 1 (true feature in) and step 2 (predicted feature in).
"""
import math, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from distill import (T0, Block, RMSNorm, generate, load_f16, load_teacher, log, run_args, save_f16,
                     set_lr, start_run, teacher_data, batches)


def teacher_feats(teacher, ids, taps=()):
    """Post-norm final features [B, T, d] (the head's input), logits [B, T, V] and the residual stream
    after each block listed in taps."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device)[None]
    ang = pos[..., None].float() * teacher.inv_freq
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x = teacher.token_embd(ids)
    extras = []
    for i, layer in enumerate(teacher.layers):
        x = layer(x, cos, sin, None, 0, None)
        if i in taps:
            extras.append(x)
    f = teacher.output_norm(x)
    return f, F.linear(f, teacher.token_embd.weight), extras


class Eagle(nn.Module):
    def __init__(self, c, taps=(), blocks=1):
        super().__init__()
        d = c["d"]
        self.cfg = c
        self.taps = tuple(taps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        if self.taps:  # lower layers' residual streams (each RMS-normed) joined to the final feature
            self.tap_norms = nn.ModuleList([RMSNorm(d, c["eps"]) for _ in self.taps])
            self.lift_fc = nn.Linear(len(self.taps) * d, d, bias=False)  # zero at start: see lift
        self.layers = nn.ModuleList([Block(d, c["n_heads"], c["n_kv"], c["ffn"], c["eps"]) for _ in range(blocks)])
        self.output_norm = RMSNorm(d, c["eps"])
        hd = d // c["n_heads"]
        inv = c["theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def lift(self, f, extras):
        """The target's features at a position -> the draft's feature input: the final feature plus a
        learned mix of the tapped lower layers (zero at start), so that the input stays in the space
        of the final feature, which is also what the draft's own predictions feed back in."""
        if not self.taps:
            return f
        parts = torch.cat([n(e).to(f.dtype) for n, e in zip(self.tap_norms, extras)], -1)
        return f + self.lift_fc(parts.to(self.lift_fc.weight.dtype)).to(f.dtype)

    def forward(self, emb, feat):
        """emb = embed(x_{t+1}), feat = f_t, both [B, T, d] -> predicted f_{t+1} [B, T, d]."""
        T = emb.shape[1]
        ang = torch.arange(T, device=emb.device)[None, :, None].float() * self.inv_freq
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        h = self.fc(torch.cat([emb, feat.to(emb.dtype)], -1))
        for layer in self.layers:
            h = layer(h, cos, sin, None, 0, None)
        return self.output_norm(h)

    def gguf_state(self):
        sd = self.state_dict()
        return {gname(k): v for k, v in sd.items()}


def gname(k):
    """Module name -> GGUF tensor name."""
    if k.startswith("layers."):
        return k.replace("layers.", "blk.", 1)
    if k == "output_norm.weight":
        return k
    return "eagle." + k


def mname(k):
    return k.replace("blk.", "layers.", 1) if k.startswith("blk.") else k.removeprefix("eagle.")


def load_weights_into(eagle, ws):
    """Load {GGUF name: array} from an earlier run or an exported draft. Blocks the source lacks (a
    deeper draft than it) keep their random start with zero output projections, so that they begin
    as the identity and the draft as the source."""
    sd = {mname(k): torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in ws.items()}
    missing, unexpected = eagle.load_state_dict(sd, strict=False)
    if unexpected:
        raise SystemExit(f"weights the draft does not have: {unexpected}")
    new = sorted({k.split(".")[1] for k in missing if k.startswith("layers.")})
    if any(not k.startswith("layers.") for k in missing):
        raise SystemExit(f"weights missing from the source: {missing}")
    with torch.no_grad():
        for i in new:
            nn.init.zeros_(eagle.layers[int(i)].attn_output.weight)
            nn.init.zeros_(eagle.layers[int(i)].ffn_down.weight)
    return [int(i) for i in new]


def pass_loss(o, zt, w, E, tv_weight, tv_temp):
    """One unrolled pass's loss: the head on its predicted features against the target's logits."""
    with torch.autocast(o.device.type, dtype=torch.bfloat16, enabled=o.is_cuda):
        z = F.linear(o, E)
    return dist_loss(z.float(), zt.float(), w, tv_weight, tv_temp)


def dist_loss(zs, zt, w, tv_weight, tv_temp):
    lt, ls = F.log_softmax(zt, -1), F.log_softmax(zs, -1)
    loss = ((lt.exp() * (lt - ls)).sum(-1) * w).sum() / w.sum()
    if tv_weight > 0:
        tv = 0.5 * (torch.softmax(zt / tv_temp, -1) - torch.softmax(zs / tv_temp, -1)).abs().sum(-1)
        loss = loss + tv_weight * (tv * w).sum() / w.sum()
    return loss


@torch.no_grad()
def eval_eagle(eagle, teacher, samples, cats, temp=0.7):
    """Step 1 (target feature in) and step 2 (own prediction in) on response positions."""
    E = teacher.token_embd.weight
    acc = {c: [0.0, 0.0, 0.0, 0.0, 0] for c in cats}
    for cat, p, r in samples:
        ids = torch.tensor(p + r, device=E.device)[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            f, zt, ex = teacher_feats(teacher, ids, eagle.taps)
            emb = teacher.token_embd(ids)
            o1 = eagle(emb[:, 1:], eagle.lift(f, ex)[:, :-1])                # index i predicts the distribution at i+1
            o2 = eagle(emb[:, 2:], o1[:, :-1])               # index i predicts the distribution at i+2
            z1 = F.linear(o1, E).float()[0]
            z2 = F.linear(o2, E).float()[0]
        zt = zt.float()[0]
        # response positions j (predict token j+1): j in [len(p)-1, len(p)+len(r)-2]; need j >= 2
        j = torch.arange(max(len(p) - 1, 2), len(p) + len(r) - 1, device=E.device)
        pt = torch.softmax(zt[j] / temp, -1)
        a = acc[cats[cat]]
        for k, z, off in ((0, z1, 1), (1, z2, 2)):
            q = torch.softmax(z[j - off] / temp, -1)
            a[k] += (1 - 0.5 * (pt - q).abs().sum(-1)).sum().item()
            a[2 + k] += (zt[j].argmax(-1) == z[j - off].argmax(-1)).sum().item()
        a[4] += len(j)
    out = {}
    for c, a in list(acc.items()) + [("overall", [sum(v[i] for v in acc.values()) for i in range(5)])]:
        n = max(a[4], 1)
        out[c] = {"step1_one_minus_tv": a[0] / n, "step2_one_minus_tv": a[1] / n,
                  "step1_greedy": a[2] / n, "step2_greedy": a[3] / n, "positions": a[4]}
    return out


def fmt(tab):
    return " | ".join(f"{k}: 1-TV {v['step1_one_minus_tv']:.3f}/{v['step2_one_minus_tv']:.3f} "
                      f"greedy {v['step1_greedy']:.3f}/{v['step2_greedy']:.3f} (n={v['positions']})"
                      for k, v in tab.items())


def main():
    ap = run_args(lr=1e-3, warmup=100, steps=1135)
    ap.add_argument("--init_from", default=None, help="dir of an earlier run (eagle_index.json + eagle_w*.f16)")
    ap.add_argument("--reg_weight", type=float, default=0.2, help="smooth-L1 pull of predicted features")
    ap.add_argument("--step2_weight", type=float, default=0.5, help="weight of each unrolled step after the first")
    ap.add_argument("--taps", default="", help="comma-separated target blocks whose outputs join the feature")
    ap.add_argument("--init_last_block", type=int, default=0, help="start the block as the target's last block")
    ap.add_argument("--init_gguf", default=None, help="start from an exported feature draft (its Q8_0 weights)")
    ap.add_argument("--max_seconds", type=float, default=0,
                    help="if set: fewer --steps where the run would end training later than this (seconds from start)")
    ap.add_argument("--blocks", type=int, default=1, help="blocks of the target's shape in the draft")
    ap.add_argument("--unroll", type=int, default=2,
                    help="drafting steps unrolled in training (the 2nd and later read the draft's own predictions)")
    args = ap.parse_args()
    dev = "cuda"
    inp, results, save_results = start_run(args)
    cats = inp["cats"]
    tcfg, teacher = load_teacher(args, dev)
    g = generate(teacher, [inp["sanity"]], 12, 0.0, amp=False)[0]
    log("sanity greedy ids", g)
    if not args.smoke and 7042 not in g:
        log("SANITY FAILED"); sys.exit(2)

    gen = torch.Generator(device=dev); gen.manual_seed(args.seed + 1)
    ev_resp = generate(teacher, [p for _, p in inp["eval"]], args.max_new, 0.7, gen)
    eval_samples = [(c, p, r) for (c, p), r in zip(inp["eval"], ev_resp)]
    log("eval continuations", sum(len(r) for r in ev_resp), "tokens")

    data, wdata, nchunk = teacher_data(teacher, inp, args, gen, tcfg["vocab"], results)
    save_results()

    taps = tuple(int(t) for t in args.taps.split(",") if t)
    if args.smoke:
        taps = tuple(sorted({t % tcfg["n_layers"] for t in taps}))  # the random teacher has 2 blocks
    eagle = Eagle(tcfg, taps, args.blocks).to(dev)
    for n_, p_ in eagle.named_parameters():
        if p_.dim() == 2:
            std = 0.02 / math.sqrt(2) if ("attn_output" in n_ or "ffn_down" in n_) else 0.02
            nn.init.normal_(p_, std=std)
    if taps:
        nn.init.zeros_(eagle.lift_fc.weight)
    if args.init_last_block:
        with torch.no_grad():
            eagle.layers[0].load_state_dict(teacher.layers[-1].state_dict())
            eagle.output_norm.weight.copy_(teacher.output_norm.weight)
    if args.init_from or args.init_gguf:
        if args.init_from:
            _, ws = load_f16(args.init_from, "eagle")
        else:
            from gguf_io import load_weights
            _, ws = load_weights(args.init_gguf)
        new = load_weights_into(eagle, ws)
        log("initialised from", args.init_from or args.init_gguf, "; new blocks (identity at start):", new)
    eagle = eagle.to(dev)
    nparam = sum(p.numel() for p in eagle.parameters())
    log("eagle params", nparam)
    results["eagle_params"] = nparam
    tab0 = eval_eagle(eagle, teacher, eval_samples, cats)
    log("eval at init:", fmt(tab0))
    results["eval_init"] = tab0

    E = teacher.token_embd.weight
    decay = [p for p in eagle.parameters() if p.dim() == 2]
    nodecay = [p for p in eagle.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step, t0, losses = 0, time.time(), []
    stream = batches(data, wdata, nchunk, args.batch, dev)
    while step < args.steps:
        if args.max_seconds and step == 20:  # fit the run (and its cosine horizon) to the time left
            per_step = (time.time() - t0) / step
            fit = 20 + int((args.max_seconds - (time.time() - T0)) / per_step)
            if fit < args.steps:
                log(f"{per_step * 1e3:.0f} ms per step: {fit} steps fit in --max_seconds (asked {args.steps})")
                args.steps = fit
        lr = set_lr(opt, args, step)
        x, wx = next(stream)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.no_grad():
                f, zt, ex = teacher_feats(teacher, x, taps)
                emb = teacher.token_embd(x)
            outs, prev = [], eagle.lift(f, ex)
            for k in range(1, args.unroll + 1):  # pass k predicts the feature k positions ahead
                prev = eagle(emb[:, k:], prev[:, :-1])
                outs.append(prev)
        losses_k = []
        for k, o in enumerate(outs, 1):
            sk = wx[:, k:] > 0
            # The head and the loss are recomputed in the backward pass instead of keeping the
            # vocabulary-wide activations of every unrolled pass.
            losses_k.append(checkpoint(pass_loss, o[sk], zt[:, k:][sk], wx[:, k:][sk], E, args.tv_weight,
                                       args.tv_temp, use_reentrant=False))
        s1 = wx[:, 1:] > 0
        reg = F.smooth_l1_loss(outs[0][s1].float(), f[:, 1:][s1].float())
        loss1, loss2 = losses_k[0], sum(losses_k[1:]) if len(losses_k) > 1 else torch.zeros(())
        loss = loss1 + args.step2_weight * loss2 + args.reg_weight * reg
        del zt, outs
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(eagle.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step <= 3:
            losses.append((step, loss1.item(), loss2.item(), reg.item()))
            log(f"step {step} loss1 {loss1.item():.4f} loss2 {loss2.item():.4f} reg {reg.item():.4f} "
                f"gnorm {gn.item():.2f} lr {lr:.2e}")
    tt = time.time() - t0
    log(f"trained {step} steps in {tt:.0f}s ({step * args.batch * args.seq / 1e6:.1f}M tokens)")
    results["train"] = {"steps": step, "seconds": tt, "losses": losses}
    eagle.eval()

    st = save_f16(eagle.gguf_state(), args.out, "eagle", {"cfg": tcfg, "taps": list(taps), "blocks": args.blocks})
    # reference: fp32 teacher features + eagle (fp16-rounded weights) on one held-out sample
    with torch.no_grad():
        ref = Eagle(tcfg, taps, args.blocks).to(dev)
        ref.load_state_dict({mname(k): torch.from_numpy(v.astype(np.float32)) for k, v in st.items()})
        ids = torch.tensor((eval_samples[0][1] + eval_samples[0][2])[:48], device=dev)[None]
        f, _, ex = teacher_feats(teacher, ids, taps)
        o = ref(teacher.token_embd(ids[:, 1:]), ref.lift(f, ex)[:, :-1])
        z = F.linear(o, E)[0].float().cpu().numpy()
    np.savez(os.path.join(args.out, "ref_eagle.npz"), ids=ids[0].cpu().numpy(), logits=z[-8:],
             feats=f[0].float().cpu().numpy())
    tab = eval_eagle(eagle, teacher, eval_samples, cats)
    log("EVAL T=0.7 step1/step2:", fmt(tab))
    results["eval"] = tab
    results["total_seconds"] = time.time() - T0
    save_results()
    log("done")


if __name__ == "__main__":
    main()
