//! Built-in prompts shared by `bench`, `eval-draft` and the app's prompt editor: the article's
//! creative prompt, three code tasks a coder model shows off on (refactor, write a test, find a
//! bug) and a question.

pub struct Preset {
    pub name: &'static str,
    pub prompt: &'static str,
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "creative",
        prompt: "Write a short story about Mara and Ilyan, two engineers who answer a distress signal from a lunar greenhouse that has been abandoned for twenty years. When they arrive they find fresh condensation on the glass even though there has been no power for decades, and a patch of blue light on the floor: Earth's light, reflected from somewhere it should not be. Describe what they discover.",
    },
    Preset {
        name: "code",
        prompt: "Refactor this Python function to be clearer and faster, and explain your changes:\n\ndef f(l):\n    r = []\n    for i in range(len(l)):\n        if l[i] % 2 == 0:\n            if l[i] not in r:\n                r.append(l[i] * l[i])\n    return r",
    },
    Preset {
        name: "test",
        prompt: "Write pytest unit tests for this function. Cover the normal cases, the empty string, and invalid input:\n\ndef parse_duration(text: str) -> int:\n    \"\"\"Parse a duration such as '1h30m', '45s' or '2h' into seconds.\"\"\"\n    units = {'h': 3600, 'm': 60, 's': 1}\n    total, number = 0, ''\n    for ch in text.strip():\n        if ch.isdigit():\n            number += ch\n        elif ch in units and number:\n            total += int(number) * units[ch]\n            number = ''\n        else:\n            raise ValueError(f'bad duration: {text!r}')\n    if number:\n        raise ValueError(f'missing unit in {text!r}')\n    return total",
    },
    Preset {
        name: "bug",
        prompt: "This function should return the k most frequent words in a text, most frequent first, but its output is sometimes wrong. Find the bug, explain it, and give the corrected code:\n\ndef top_words(text, k):\n    counts = {}\n    for word in text.lower().split():\n        counts[word] = counts.get(word, 0) + 1\n    ranked = sorted(counts.items(), key=lambda kv: kv[1])\n    return [w for w, _ in ranked[:k]]",
    },
    Preset {
        name: "qa",
        prompt: "Explain why the sky is blue during the day and red at sunset. Answer in a few clear paragraphs.",
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}
