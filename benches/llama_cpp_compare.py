"""Usage: python3 benches/llama_cpp_compare.py MODEL.gguf [--mentor-lab PATH] [--threads N] [--skip-speed]
(pip install llama-cpp-python==0.3.36)

llama.cpp (llama-cpp-python) on the same GGUF as Mentor Lab.

Speed: decode tok/s and the cost of a forward over k new tokens relative to one, 2 threads by
default. Mirrors `mentor-lab cost`: a 128-token prompt, then forwards at that position, median of
repeats.

Log-probabilities (with --mentor-lab, the path of a built `mentor-lab`): Mentor Lab samples
continuations of a few raw prompts at T = 1 (its JSON output gives each token's id and p(x), the
target's softmax at that position); llama.cpp evaluates the same prompt and tokens with logits for
every position, and the script prints the mean and largest |Δ log p| per prompt. On quantized files
both programs quantize the activations differently, so expect the level of quantization noise
(a few hundredths of a nat); with F32 weights, about a thousandth.

On a VM whose CPU lists AMX but does not let programs use it, a native build (GGML_NATIVE=ON) dies
with SIGILL in llama.cpp's AMX kernel (`tileloadd`); build with the vector extensions named instead:
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
pip install llama-cpp-python==0.3.36"""
import argparse, json, math, statistics, subprocess, time
from llama_cpp import Llama

PROMPTS = [
    "Once upon a time, in a village at the edge of the forest,",
    "def fibonacci(n):\n    ",
    "The three largest cities in Japan are",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. 日本語も少し。",
]


def speed(path, threads):
    m = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512,
              verbose=False, seed=42)
    prompt = m.tokenize(b"Write a short story about a lighthouse keeper who finds a message in a bottle. " * 8)[:128]
    t = time.perf_counter(); m.reset(); m.eval(prompt); pre = time.perf_counter() - t
    print(f"prefill {len(prompt)} tokens {pre*1000:.1f} ms -> {len(prompt)/pre:.0f} tok/s")
    base = None
    for k in [1, 2, 4, 8, 9, 16]:
        ts = []
        for _ in range(15):
            m.n_tokens = len(prompt)
            t = time.perf_counter(); m.eval(prompt[:k]); ts.append(time.perf_counter() - t)
        med = statistics.median(ts) * 1000
        base = base or med
        print(f"| {k} | {med:.2f} | {med/base:.2f}x |")
    # decode: 256 sampled tokens at T=0.7 from the chat prompt
    first = None; n = 0
    chat = "<|im_start|>user\nWrite a story about a dragon<|im_end|>\n<|im_start|>assistant\n"
    for _ in m.create_completion(chat, max_tokens=256, temperature=0.7, stream=True):
        n += 1
        if first is None:
            first = time.perf_counter()
    dt = time.perf_counter() - first
    print(f"decode: {n} tokens, {(n-1)/dt:.1f} tok/s (after the first token)")


def log_softmax_at(row, x):
    top = max(row)
    return row[x] - top - math.log(sum(math.exp(v - top) for v in row))


def logprobs(path, mentor, threads, n_tokens=48, seeds=(1, 2)):
    m = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512,
              logits_all=True, verbose=False)
    all_deltas = []
    print("| prompt | seed | tokens | mean abs delta log p | max |")
    print("|---|---|---|---|---|")
    for p_i, prompt in enumerate(PROMPTS):
        for seed in seeds:
            out = subprocess.run(
                [mentor, "generate", "--target", path, "--mode", "target", "--raw", "--prompt", prompt,
                 "--max-tokens", str(n_tokens), "--temperature", "1", "--seed", str(seed), "--ignore-eos",
                 "--threads", str(threads), "--json"],
                check=True, capture_output=True, text=True).stdout
            g = json.loads(out)
            ids = [t["id"] for t in g["tokens"]]
            ours = [math.log(max(t["p_target"], 1e-30)) for t in g["tokens"]]
            prompt_ids = m.tokenize(prompt.encode(), add_bos=True, special=True)
            if len(prompt_ids) != g["stats"]["n_prompt_tokens"]:
                print(f"prompt {p_i}: llama.cpp reads {len(prompt_ids)} prompt tokens, Mentor Lab "
                      f"{g['stats']['n_prompt_tokens']}: skipped")
                break
            m.reset()
            m.eval(prompt_ids + ids[:-1])
            n0 = len(prompt_ids) - 1
            theirs = [log_softmax_at(list(m.scores[n0 + i]), x) for i, x in enumerate(ids)]
            deltas = [abs(a - b) for a, b in zip(ours, theirs)]
            all_deltas += deltas
            print(f"| {p_i} | {seed} | {len(ids)} | {statistics.mean(deltas):.4f} | {max(deltas):.4f} |")
    if all_deltas:
        print(f"all: {len(all_deltas)} tokens, mean |delta log p| {statistics.mean(all_deltas):.4f} nats, "
              f"max {max(all_deltas):.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--mentor-lab", help="a built mentor-lab: also compare per-token log-probabilities")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-speed", action="store_true")
    a = ap.parse_args()
    if not a.skip_speed:
        speed(a.model, a.threads)
    if a.mentor_lab:
        logprobs(a.model, a.mentor_lab, a.threads)


if __name__ == "__main__":
    main()
