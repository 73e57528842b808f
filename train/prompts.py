"""Deterministic prompt sets for draft distillation: templates x topics, 4 categories.
Writes build/prompts_train.jsonl and ../assets/prompts/eval.jsonl (held-out, different topics)."""
import json, os, random

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


def build_train():
    rng = random.Random(SEED)
    out = []
    for t in CREATIVE_T:
        for x in CREATIVE_TOPICS:
            out.append(("creative", t.format(t=x)))
    for t in CODE_T:
        for x in CODE_TOPICS:
            out.append(("code", t.format(t=x)))
    out += [("code", p) for p in CODE_EXTRA]
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
    tr = build_train()
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
