"""Deterministic prompt sets for draft distillation: templates x topics, 4 categories.
Writes build/prompts_train.jsonl and ../assets/prompts/eval.jsonl (held-out, different topics).

usage: python3 train/prompts.py [--no-snippets]
--no-snippets writes the 3,286-prompt set without the pasted-code prompts (the set of the first
independent-draft runs and of the feature draft)."""
import json, os, random, sys

SEED = 1234

CREATIVE_T = [
    "Write a short poem about {t}.", "Write a haiku about {t}.", "Write a short story about {t}.",
    "Describe {t} in vivid detail.", "Write a limerick about {t}.", "Write the opening paragraph of a novel about {t}.",
    "Write song lyrics about {t}.", "Write a children's story about {t}.", "Write a funny story involving {t}.",
    "Write a diary entry from someone experiencing {t}.", "Write a sonnet about {t}.",
    "Write a short dialogue between two friends about {t}.", "Write a fairy tale that features {t}.",
    "Write a mysterious short story about {t}.", "Write a motivational speech inspired by {t}.",
    "Write a free verse poem about {t}.", "Write a bedtime story about {t}.", "Write a scene for a play about {t}.",
    "Write a product description for {t}, in a playful tone.", "Write a postcard message about {t}.",
]
CREATIVE_TOPICS = [
    "the ocean at night", "a lost dog finding its way home", "autumn leaves", "a robot learning to love", "a rainy city",
    "the first day of school", "a dragon who is afraid of fire", "friendship", "a lighthouse keeper", "the moon",
    "a time traveler", "an old bookstore", "a summer thunderstorm", "a cat who rules the house", "a journey through the desert",
    "growing old", "a secret garden", "a haunted house", "a spaceship crew", "a small village festival", "the sound of silence",
    "a broken clock", "winter mornings", "a pirate's treasure", "a talking tree", "the last day of summer", "a busy kitchen",
    "a mountain climber", "a forgotten letter", "a magical library", "coffee", "a train ride", "the stars", "a little bird",
    "a city of the future", "a kind stranger", "the wind", "a snowman", "a musician playing in the street", "an island",
    "hope", "a detective solving a case", "a family dinner", "a river", "a shy monster", "a birthday party",
    "the northern lights", "a farmer and his horse", "a lonely astronaut", "a fox in the forest", "a sunrise",
    "an ancient castle", "a soccer match", "a baker who makes magic bread", "a garden in spring", "a storm at sea",
    "a wizard's apprentice", "a grandmother's recipe", "a penguin", "a road trip", "the color blue", "a painter",
    "a thunderstorm over the prairie", "a child's imagination", "an underwater kingdom", "a clockmaker", "a lost key",
    "the smell of rain", "a giant and a mouse", "a night market", "a bicycle", "an elephant", "a message in a bottle",
]

CODE_T = [
    "Write a Python function that {t}.", "Write a JavaScript function that {t}.", "How do I {t} in Python?",
    "Write a C function that {t}.", "Write a Rust function that {t}.", "Show me a Java method that {t}.",
    "Explain how to {t} in Python, with an example.", "Write a Go function that {t}.",
    "Write a short Python script that {t}, and explain it.", "Write a TypeScript function that {t}.",
    "Write a C++ function that {t}.", "Write a bash command or script that {t}.",
]
CODE_TOPICS = [
    "reverses a string", "checks if a number is prime", "computes the factorial of a number", "sorts a list of numbers",
    "finds the maximum element in an array", "counts the vowels in a string", "checks if a string is a palindrome",
    "reads a file and counts its lines", "computes the Fibonacci sequence", "merges two sorted lists",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "finds the greatest common divisor of two numbers",
    "implements binary search", "flattens a nested list", "counts word frequencies in a text", "validates an email address",
    "calculates the average of a list", "generates a random password", "parses a JSON string", "implements a stack",
    "implements a queue", "checks if two strings are anagrams", "finds the second largest number in a list",
    "capitalizes every word in a sentence", "computes the sum of the digits of a number", "transposes a matrix",
    "implements bubble sort", "implements quicksort", "returns the n-th prime number", "converts a number to binary",
    "finds all even numbers in a list", "computes the power of a number recursively", "checks if a year is a leap year",
    "splits a sentence into words", "finds the longest word in a sentence", "rotates an array by k positions",
    "counts the number of set bits in an integer", "computes the dot product of two vectors", "removes whitespace from a string",
    "downloads a web page", "lists all files in a directory", "measures how long a function takes", "implements a linked list",
    "finds the intersection of two lists", "computes the median of a list", "checks whether parentheses are balanced",
    "converts a string to title case", "implements a simple calculator", "reads a CSV file",
]
CODE_EXTRA = [
    "What is the difference between a list and a tuple in Python?", "Explain what a closure is in JavaScript.",
    "What is recursion? Give a simple example.", "Explain the difference between == and === in JavaScript.",
    "What does the 'yield' keyword do in Python?", "Explain Big O notation with examples.",
    "What is a race condition?", "How does garbage collection work?", "What is the difference between a process and a thread?",
    "Explain what an API is.", "What is a hash table?", "Explain ownership in Rust.", "What is git rebase?",
    "How do I create a virtual environment in Python?", "What is SQL injection and how do I prevent it?",
    "Explain object-oriented programming.", "What is the difference between TCP and UDP?", "What is a REST API?",
    "Explain how a for loop works in Python.", "What are Python decorators?",
]

# Prompts that paste code and ask for work on it: review, refactor, explain, fix, port.
# None of these snippets is the `code` bench preset's function (src/presets.rs).
SNIPPET_T = [
    "Refactor this {lang} code to be clearer, and explain your changes:\n\n{c}",
    "Explain what this {lang} code does, line by line:\n\n{c}",
    "Is there a bug in this {lang} code? If so, fix it:\n\n{c}",
    "Make this {lang} code faster and explain why it is faster:\n\n{c}",
    "Add comments and better names to this {lang} code:\n\n{c}",
    "Write unit tests for this {lang} code:\n\n{c}",
    "Simplify this {lang} code:\n\n{c}",
    "Review this {lang} code and suggest improvements:\n\n{c}",
    "Rewrite this {lang} code in a more idiomatic style:\n\n{c}",
    "What is the time complexity of this {lang} code? Can it be improved?\n\n{c}",
]
SNIPPETS = [
    ("Python", "def g(s):\n    out = ''\n    for ch in s:\n        if ch != ' ':\n            out = out + ch\n    return out"),
    ("Python", "def total(xs):\n    t = 0\n    i = 0\n    while i < len(xs):\n        t = t + xs[i]\n        i = i + 1\n    return t"),
    ("Python", "def find(d, v):\n    for k in d.keys():\n        if d[k] == v:\n            return k\n    return None"),
    ("Python", "def avg(nums):\n    s = 0\n    for n in nums:\n        s += n\n    return s / len(nums)"),
    ("Python", "def count_words(text):\n    words = text.split(' ')\n    c = {}\n    for w in words:\n        if w in c:\n            c[w] = c[w] + 1\n        else:\n            c[w] = 1\n    return c"),
    ("Python", "def is_prime(n):\n    for i in range(2, n):\n        if n % i == 0:\n            return False\n    return True"),
    ("Python", "def longest(words):\n    best = ''\n    for w in words:\n        if len(w) > len(best):\n            best = w\n    return best"),
    ("Python", "def merge(a, b):\n    r = a + b\n    r.sort()\n    return r"),
    ("Python", "def dedupe(items):\n    seen = []\n    for x in items:\n        if x not in seen:\n            seen.append(x)\n    return seen"),
    ("Python", "def read_numbers(path):\n    f = open(path)\n    nums = []\n    for line in f.readlines():\n        nums.append(int(line))\n    return nums"),
    ("Python", "def fib(n):\n    if n <= 1:\n        return n\n    return fib(n - 1) + fib(n - 2)"),
    ("Python", "def flatten(xss):\n    out = []\n    for xs in xss:\n        for x in xs:\n            out.append(x)\n    return out"),
    ("Python", "def grades(scores):\n    res = []\n    for s in scores:\n        if s >= 90:\n            res.append('A')\n        elif s >= 80:\n            res.append('B')\n        else:\n            res.append('C')\n    return res"),
    ("Python", "class Counter:\n    def __init__(self):\n        self.n = 0\n    def inc(self):\n        self.n = self.n + 1\n    def get(self):\n        return self.n"),
    ("Python", "def pairs(xs, target):\n    out = []\n    for i in range(len(xs)):\n        for j in range(len(xs)):\n            if i != j and xs[i] + xs[j] == target:\n                out.append((xs[i], xs[j]))\n    return out"),
    ("Python", "def max_val(lst):\n    m = lst[0]\n    for i in range(1, len(lst)):\n        if lst[i] > m:\n            m = lst[i]\n    return m"),
    ("Python", "def rev(s):\n    r = ''\n    for i in range(len(s) - 1, -1, -1):\n        r += s[i]\n    return r"),
    ("Python", "def vowels(s):\n    n = 0\n    for c in s:\n        if c == 'a' or c == 'e' or c == 'i' or c == 'o' or c == 'u':\n            n += 1\n    return n"),
    ("Python", "def odd_cubes(l):\n    res = []\n    for x in l:\n        if x % 2 == 1:\n            res.append(x ** 3)\n    return res"),
    ("Python", "def matrix_sum(m):\n    s = 0\n    for i in range(len(m)):\n        for j in range(len(m[i])):\n            s = s + m[i][j]\n    return s"),
    ("JavaScript", "function sum(arr) {\n  var s = 0;\n  for (var i = 0; i < arr.length; i++) {\n    s = s + arr[i];\n  }\n  return s;\n}"),
    ("JavaScript", "function getNames(users) {\n  let names = [];\n  for (let i = 0; i < users.length; i++) {\n    if (users[i].active == true) {\n      names.push(users[i].name);\n    }\n  }\n  return names;\n}"),
    ("JavaScript", "function isEmpty(obj) {\n  for (var key in obj) {\n    return false;\n  }\n  return true;\n}"),
    ("JavaScript", "function countChar(str, ch) {\n  let n = 0;\n  for (const c of str.split('')) {\n    if (c === ch) n++;\n  }\n  return n;\n}"),
    ("C", "int max(int *a, int n) {\n    int m = a[0];\n    for (int i = 0; i < n; i++)\n        if (a[i] > m) m = a[i];\n    return m;\n}"),
    ("C", "void reverse(char *s) {\n    int n = strlen(s);\n    for (int i = 0; i < n / 2; i++) {\n        char t = s[i];\n        s[i] = s[n - i];\n        s[n - i] = t;\n    }\n}"),
    ("C", "int count_spaces(const char *s) {\n    int c = 0;\n    for (int i = 0; s[i] != 0; i++)\n        if (s[i] == ' ') c++;\n    return c;\n}"),
    ("Rust", "fn sum_even(v: &Vec<i32>) -> i32 {\n    let mut s = 0;\n    for i in 0..v.len() {\n        if v[i] % 2 == 0 {\n            s = s + v[i];\n        }\n    }\n    s\n}"),
    ("Rust", "fn first_word(s: &String) -> String {\n    let mut w = String::new();\n    for c in s.chars() {\n        if c == ' ' { break; }\n        w.push(c);\n    }\n    w\n}"),
    ("Go", "func contains(xs []int, v int) bool {\n\tfor i := 0; i < len(xs); i++ {\n\t\tif xs[i] == v {\n\t\t\treturn true\n\t\t}\n\t}\n\treturn false\n}"),
    ("Go", "func average(xs []float64) float64 {\n\tvar s float64\n\tfor _, x := range xs {\n\t\ts += x\n\t}\n\treturn s / float64(len(xs))\n}"),
    ("Java", "public static int countPositive(int[] a) {\n    int c = 0;\n    for (int i = 0; i < a.length; i++) {\n        if (a[i] > 0) {\n            c = c + 1;\n        }\n    }\n    return c;\n}"),
    ("Java", "public String join(List<String> parts) {\n    String s = \"\";\n    for (String p : parts) {\n        s = s + p + \",\";\n    }\n    return s;\n}"),
    ("SQL", "SELECT * FROM orders WHERE customer_id IN (SELECT id FROM customers WHERE country = 'France') ORDER BY date"),
    ("Bash", "for f in $(ls *.txt); do\n  cat $f | grep error | wc -l\ndone"),
    ("TypeScript", "function parseAge(input: any): number {\n  let n = parseInt(input);\n  if (n == NaN) {\n    return 0;\n  }\n  return n;\n}"),
]

QA_T = [
    "What is {t}?", "Explain {t} in simple terms.", "Can you tell me about {t}?", "Why is {t} important?",
    "Give me three facts about {t}.", "How would you explain {t} to a child?", "What are the main ideas behind {t}?",
    "Write a short summary of {t}.", "What is the history of {t}?", "What are the pros and cons of {t}?",
]
QA_TOPICS = [
    "photosynthesis", "the water cycle", "gravity", "the French Revolution", "democracy", "black holes", "DNA",
    "climate change", "the Roman Empire", "vaccines", "electricity", "the Internet", "the theory of evolution",
    "inflation in economics", "the human heart", "volcanoes", "the solar system", "artificial intelligence",
    "the Renaissance", "plate tectonics", "the immune system", "World War II", "renewable energy", "the stock market",
    "the Great Wall of China", "the printing press", "quantum mechanics", "the Industrial Revolution", "the Moon landing",
    "the periodic table", "machine learning", "the Amazon rainforest", "earthquakes", "the human brain", "nuclear energy",
    "the Olympic Games", "ancient Egypt", "the speed of light", "antibiotics", "the ozone layer", "blockchain",
    "the Cold War", "cells", "supply and demand", "the Silk Road", "photosynthesis in algae", "weather forecasting",
    "the Pythagorean theorem", "the Big Bang", "sleep", "the greenhouse effect", "bees and pollination",
    "the United Nations", "magnetism", "the Mona Lisa", "the human skeleton", "coral reefs", "compound interest",
]
QA_EXTRA_T = ["What is the capital of {c}?", "What language is spoken in {c}?", "Tell me about the geography of {c}.",
              "What is {c} famous for?"]
COUNTRIES = ["France", "Germany", "Japan", "Brazil", "Canada", "Australia", "Egypt", "India", "Mexico", "Italy",
             "Spain", "Kenya", "Argentina", "Norway", "Thailand", "Turkey", "Greece", "Peru", "Vietnam", "Poland"]
QA_WHY = ["Why is the sky blue?", "Why do leaves change color in autumn?", "How do airplanes fly?", "How does a rainbow form?",
          "Why do we have seasons?", "How do magnets work?", "Why is the ocean salty?", "How does the heart pump blood?",
          "How many planets are in the solar system?", "Who wrote Romeo and Juliet?", "Who painted the Sistine Chapel ceiling?",
          "Who was Albert Einstein?", "Who was Marie Curie?", "What is the boiling point of water?", "How far is the Sun from Earth?",
          "What is the largest animal on Earth?", "What is the tallest mountain in the world?", "How do bees make honey?",
          "Why do cats purr?", "What causes thunder?"]

CHAT_T = [
    "Can you give me some tips for {t}?", "I want to get better at {t}. Where should I start?",
    "What are some common mistakes people make when {t}?", "I'm nervous about {t}. Any advice?",
    "How much time should I spend on {t} each week?", "My friend suggested {t}. Is it a good idea?",
    "What do I need to know before {t}?", "Can you make a simple plan for {t}?",
    "Is {t} expensive? How can I keep costs down?", "I tried {t} once and gave up. How do I stick with it this time?",
    "What equipment or tools do I need for {t}?", "Can you motivate me to keep {t}?",
    "How do I explain to my family why I'm {t}?", "What's a realistic first goal for {t}?",
]
CHAT_TOPICS = [
    "learning to cook", "running a marathon", "learning a new language", "saving money", "starting a garden",
    "traveling alone", "job interviews", "public speaking", "learning to play guitar", "moving to a new city",
    "sleeping better", "studying for exams", "making new friends", "working from home", "adopting a dog",
    "staying motivated", "eating healthier", "learning to swim", "writing a resume", "planning a wedding",
    "reducing stress", "learning to draw", "keeping a journal", "hiking in the mountains", "decluttering my house",
    "buying a first car", "starting a small business", "going back to school", "learning to code", "meditating",
    "training a puppy", "camping with kids", "baking bread", "organizing my schedule", "taking better photos",
]
CHAT_FREE = [
    "Hi! How are you today?", "Hello, what can you do?", "Tell me a joke.", "Tell me a fun fact.", "Good morning!",
    "I'm bored. What should I do?", "I'm feeling sad today.", "What's your favorite book?", "Can you recommend a movie?",
    "What should I cook for dinner tonight?", "Thank you for your help!", "I had a really long day at work.",
    "What is a good gift for my mom's birthday?", "Can you help me plan my weekend?", "What are some fun things to do on a rainy day?",
    "Give me a motivational quote.", "How do I stay focused while studying?", "I can't decide what to eat for lunch.",
    "What are some good habits to start?", "Who are you?", "Tell me something interesting about space.",
    "What's a good name for a cat?", "I just got a promotion!", "Can you suggest a hobby for me?", "How can I be more productive?",
    "What's the best way to learn something new?", "Recommend me a good podcast topic.", "What should I pack for a beach trip?",
    "I'm planning a picnic. What food should I bring?", "Help me write a text to cancel plans with a friend.",
    "Write a short thank-you note to my teacher.", "What is a healthy breakfast?", "Can you tell me a riddle?",
    "I want to surprise my partner. Any ideas?", "What are some easy dinner recipes?", "How do I make a good cup of coffee?",
]

# Held-out evaluation prompts: topics that do not occur in the training lists.
EVAL = {
    "creative": [
        "Write a short poem about a glass of lemonade on a hot afternoon.",
        "Write a short story about a mailman who delivers letters to ghosts.",
        "Write a haiku about a sleeping volcano.",
        "Describe an abandoned amusement park in vivid detail.",
        "Write a limerick about a forgetful octopus.",
        "Write the opening paragraph of a novel about a chess prodigy.",
        "Write song lyrics about a tram that never stops.",
        "Write a children's story about a caterpillar who wants to be a pilot.",
        "Write a diary entry from a scarecrow in a cornfield.",
        "Write a fairy tale about a silver violin.",
    ],
    "code": [
        "Write a Python function that checks whether a list is sorted.",
        "Write a JavaScript function that counts how many times a character appears in a string.",
        "How do I convert a dictionary to a list of tuples in Python?",
        "Write a Rust function that returns the sum of the squares of a slice of integers.",
        "Write a C function that swaps two integers using pointers.",
        "Write a Python function that computes the running total of a list.",
        "Explain what a Python list comprehension is, with an example.",
        "Write a Go function that reverses a slice of integers.",
        "What is the difference between a compiler and an interpreter?",
        "Write a Python class for a bank account with deposit and withdraw methods.",
    ],
    "qa": [
        "What is the capital of Portugal?",
        "Explain how tides work in simple terms.",
        "Who was Leonardo da Vinci?",
        "What is osmosis?",
        "Why do birds migrate?",
        "Give me three facts about the planet Mars.",
        "What is the difference between weather and climate?",
        "How does a refrigerator keep food cold?",
        "What was the Byzantine Empire?",
        "What are glaciers and how do they form?",
    ],
    "chat": [
        "Can you give me some tips for learning to ski?",
        "I'm nervous about my first day at a new job. Any advice?",
        "What should I bring to a housewarming party?",
        "Hi there! Can you recommend a board game for four people?",
        "I keep procrastinating on my homework. What can I do?",
        "What are some fun activities for a family reunion?",
        "How do I politely say no to extra work from my boss?",
        "I want to start drinking more water. Any tricks?",
        "What is a good way to spend a quiet Sunday?",
        "My sister is visiting next week. What could we do together?",
    ],
}


def build_train(snippets=True):
    """The training prompts, shuffled. snippets=False leaves out the 360 pasted-code prompts: the
    3,286-prompt set the first independent-draft runs and the feature draft were trained on."""
    rng = random.Random(SEED)
    out = []
    for t in CREATIVE_T:
        for x in CREATIVE_TOPICS:
            out.append(("creative", t.format(t=x)))
    for t in CODE_T:
        for x in CODE_TOPICS:
            out.append(("code", t.format(t=x)))
    out += [("code", p) for p in CODE_EXTRA]
    if snippets:
        out += [("code", t.format(lang=lang, c=c)) for t in SNIPPET_T for lang, c in SNIPPETS]
    for t in QA_T:
        for x in QA_TOPICS:
            out.append(("qa", t.format(t=x)))
    for t in QA_EXTRA_T:
        for c in COUNTRIES:
            out.append(("qa", t.format(c=c)))
    out += [("qa", p) for p in QA_WHY]
    for t in CHAT_T:
        for x in CHAT_TOPICS:
            out.append(("chat", t.format(t=x)))
    out += [("chat", p) for p in CHAT_FREE]
    evals = {p for ps in EVAL.values() for p in ps}
    out = [o for o in dict.fromkeys(out) if o[1] not in evals]
    rng.shuffle(out)
    return out


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(here, "build"), exist_ok=True)
    tr = build_train(snippets="--no-snippets" not in sys.argv[1:])
    with open(os.path.join(here, "build", "prompts_train.jsonl"), "w") as f:
        for c, p in tr:
            f.write(json.dumps({"category": c, "prompt": p}) + "\n")
    ev_path = os.path.join(here, "..", "assets", "prompts", "eval.jsonl")
    os.makedirs(os.path.dirname(ev_path), exist_ok=True)
    with open(ev_path, "w") as f:
        for c, ps in EVAL.items():
            for p in ps:
                f.write(json.dumps({"category": c, "prompt": p}) + "\n")
    from collections import Counter
    print(len(tr), Counter(c for c, _ in tr))
