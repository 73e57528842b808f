"""Plain numpy Llama forward (llama.cpp layout: interleaved RoPE on adjacent pairs, tied head)."""
import numpy as np


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_i(x, pos, theta):
    # x [T, H, hd]; rotate adjacent pairs (x[2i], x[2i+1])
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward(cfg, w, ids):
    """Full-sequence causal forward; returns logits [T, vocab] (float32)."""
    f, _ = features(cfg, w, w["token_embd.weight"][np.asarray(ids)].astype(np.float32))
    return f @ w["token_embd.weight"].T


def features(cfg, w, x, taps=()):
    """The blocks and final norm over embeddings x [T, d]: (final normed features [T, d], the
    residual stream after each block listed in taps)."""
    T = len(x)
    d, H, KV = cfg["d"], cfg["n_heads"], cfg["n_kv"]
    hd = d // H
    eps, theta = cfg["eps"], cfg["theta"]
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    extras = []
    for l in range(cfg["n_layers"]):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(T, H, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, hd)
        q, k = rope_i(q, pos, theta), rope_i(k, pos, theta)
        rep = H // KV
        k = np.repeat(k, rep, axis=1); v = np.repeat(v, rep, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True)); att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, H * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        if l in taps:
            extras.append(x)
    return rmsnorm(x, w["output_norm.weight"], eps), extras
