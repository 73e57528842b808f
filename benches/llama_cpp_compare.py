"""Usage: python3 benches/llama_cpp_compare.py MODEL.gguf  (pip install llama-cpp-python==0.3.36)

llama.cpp (llama-cpp-python) on the same GGUF: decode tok/s and the cost of a forward over k new
tokens relative to one, 2 threads. Mirrors `mentor-lab cost`: a 128-token prompt, then forwards at that
position, median of repeats.

On a VM whose CPU lists AMX but does not let programs use it, a native build (GGML_NATIVE=ON) dies
with SIGILL in llama.cpp's AMX kernel (`tileloadd`); build with the vector extensions named instead:
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
pip install llama-cpp-python==0.3.36"""
import sys, time, statistics
from llama_cpp import Llama
path = sys.argv[1]
m = Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=1024, n_batch=512, verbose=False, seed=42)
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
t0 = time.perf_counter(); n = 0; first = None
for out in m.create_completion("<|im_start|>user\nWrite a story about a dragon<|im_end|>\n<|im_start|>assistant\n", max_tokens=256, temperature=0.7, stream=True):
    n += 1
    if first is None: first = time.perf_counter()
dt = time.perf_counter() - first
print(f"decode: {n} tokens, {(n-1)/dt:.1f} tok/s (after the first token)")
