//! Built-in prompts shared by `bench`, `eval-draft` and the app's prompt editor.

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
        name: "qa",
        prompt: "Explain why the sky is blue during the day and red at sunset. Answer in a few clear paragraphs.",
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}
