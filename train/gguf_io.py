"""Read a llama.cpp GGUF (numpy + gguf-py only): metadata, dequantized weights, tokenizer."""
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(r, key):
    f = r.fields[key]
    return f.contents()


def load_config(r):
    g = lambda k: field(r, k)
    d = g("llama.embedding_length")
    nh = g("llama.attention.head_count")
    return dict(vocab=int(g("llama.vocab_size")) if "llama.vocab_size" in r.fields else len(r.fields["tokenizer.ggml.tokens"].data),
                d=int(d), n_layers=int(g("llama.block_count")), n_heads=int(nh),
                n_kv=int(g("llama.attention.head_count_kv")), ffn=int(g("llama.feed_forward_length")),
                eps=float(g("llama.attention.layer_norm_rms_epsilon")), theta=float(g("llama.rope.freq_base")))


def load_weights(path, dtype=np.float32):
    """Returns (cfg, {gguf_name: array in PyTorch layout [out, in]})."""
    r = GGUFReader(path)
    cfg = load_config(r)
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # ne reversed = torch layout
        w[t.name] = np.ascontiguousarray(a.reshape(shape).astype(dtype))
    return cfg, w


def build_tokenizer(path):
    """HF `tokenizers` BPE equivalent to llama.cpp's for pre='smollm'."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
    r = GGUFReader(path)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False) for i in range(len(tokens)) if types[i] == 3]
    tok.add_special_tokens(specials)
    return tok


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_prompt(user):
    """Same string the GGUF chat template renders for one user turn + generation prompt."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
