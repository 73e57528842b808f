//! Left panel: prompt, sampling knobs, mentor settings, Run / Stop, sweep grid.

use super::settings::Settings;
use super::{MentorApp, UiCommand};
use crate::generate::MAX_TREE_WIDTH;
use crate::mentor::{Coupling, MentorRule};
use crate::presets::PRESETS;

/// A slider with a visible label tied to it (so tests and screen readers find it by name).
fn labelled<T: egui::emath::Numeric>(
    ui: &mut egui::Ui,
    label: &str,
    value: &mut T,
    range: std::ops::RangeInclusive<T>,
    step: f64,
) {
    ui.horizontal(|ui| {
        let l = ui.label(label);
        ui.add(egui::Slider::new(value, range).step_by(step)).labelled_by(l.id);
    });
}

pub fn controls_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let busy = app.view.busy() || app.view.sweep.run_id.is_some() || app.view.experiment.run_id.is_some();
    prompt_ui(&mut app.settings, ui);
    ui.separator();
    mentor_ui(app, ui);
    ui.separator();
    sampling_ui(&mut app.settings, ui);
    ui.separator();
    run_stop_ui(app, ui, busy);
    ui.separator();
    sweep_ui(app, ui, busy);
}

fn prompt_ui(s: &mut Settings, ui: &mut egui::Ui) {
    ui.heading("Prompt");
    ui.horizontal_wrapped(|ui| {
        for p in PRESETS {
            if ui.selectable_label(s.prompt == p.prompt, p.name).clicked() {
                s.prompt = p.prompt.to_string();
            }
        }
        ui.checkbox(&mut s.raw, "raw (no chat template)");
    });
    let l = ui.label("Prompt text");
    ui.add(egui::TextEdit::multiline(&mut s.prompt).desired_rows(6).desired_width(f32::INFINITY)).labelled_by(l.id);
}

fn mentor_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let corpus = app.view.models.corpus.clone();
    let s = &mut app.settings;
    ui.heading("Mentor");
    rule_ui(s, ui);
    ui.horizontal(|ui| {
        ui.label("Coupling");
        ui.radio_value(&mut s.coupling, Coupling::SameSeed, "same seed").on_hover_text(
            "Both panes draw each position with the same noise: at budget 0 the texts are identical, \
             and where they differ the budget bought the change. Accepts somewhat fewer drafted tokens.",
        );
        ui.radio_value(&mut s.coupling, Coupling::MaxAcceptance, "max acceptance").on_hover_text(
            "The classic rule: accepts the most drafted tokens (min(1, π/q)), but the mentored text is \
             a different random sample from the target-only one even at budget 0.",
        );
    });
    ui.add_enabled_ui(!s.adaptive || s.tree, |ui| labelled(ui, "Draft length", &mut s.draft_len, 1..=16, 1.0));
    ui.checkbox(&mut s.adaptive, "adaptive draft length").on_hover_text(
        "Chooses k each round from measured acceptance and draft/verify costs; may fall back to target-only steps",
    );
    let asked = ui
        .horizontal(|ui| {
            ui.add_enabled_ui(s.adaptive, |ui| ui.checkbox(&mut s.lookup, "adaptive: copy from the context"))
                .response
                .on_hover_text("Where the last tokens occurred before, propose what followed them (no draft forward); the policy uses it only where its measured acceptance pays. Copied tokens are highlighted apart.");
            ui.add_enabled_ui(s.adaptive && s.lookup, |ui| corpus_ui(&corpus, !s.copy_from.is_empty(), ui)).inner
        })
        .inner;
    ui.checkbox(&mut s.bonus, "bonus token after a fully accepted round");
    ui.add_enabled_ui(s.coupling == Coupling::SameSeed && s.adaptive && !s.tree, |ui| {
        ui.checkbox(&mut s.side_offers, "adaptive chain: also verify the draft's runners-up")
    })
    .response
    .on_hover_text(
        "A small tree: beside the drafted chain, the target also checks the draft's second and third \
         choices where the policy expects that to pay (one more row of the verify forward each). When the \
         target's token is one of them, the round keeps it and the target's next token instead of ending. \
         The text stays exactly what it would be without them. The inspector lists each position's checked \
         candidates.",
    );
    tree_ui(s, ui);
    if let Some(cmd) = asked {
        app.queue(cmd);
    }
}

/// "and a folder": a folder of the user's (code, documents) that adaptive rounds copy from as
/// from the context; the button shows how much was read (all of it on hover), × stops.
fn corpus_ui(corpus: &Option<Result<String, String>>, chosen: bool, ui: &mut egui::Ui) -> Option<UiCommand> {
    const WHAT: &str = "Also copy from your own files (a source tree, the documents the prompt is about): where the \
        text runs along a passage of them, the next tokens are proposed from it with no draft forward and \
        verified like any copy, so the text stays the target's at budget 0. Up to 16 MB of text.";
    let (label, hover) = match (corpus, chosen) {
        (Some(Ok(summary)), _) => {
            (summary.split(',').next().unwrap_or_default().to_string(), format!("Copying from {summary}.\n\n{WHAT}"))
        }
        (Some(Err(e)), _) => ("folder not read".to_string(), e.clone()),
        (None, true) => ("reading…".to_string(), WHAT.to_string()),
        (None, false) => ("+ a folder…".to_string(), WHAT.to_string()),
    };
    let mut button = egui::Button::new(egui::RichText::new(label).small());
    if matches!(corpus, Some(Err(_))) {
        button = button.fill(ui.visuals().error_fg_color.gamma_multiply(0.3));
    }
    let mut asked = ui.add(button).on_hover_text(hover).clicked().then_some(UiCommand::PickCorpus);
    if chosen && ui.small_button("×").on_hover_text("Stop copying from the folder").clicked() {
        asked = Some(UiCommand::ClearCorpus);
    }
    asked
}

/// The rule's parameter slider, labelled and ranged by the rule itself (its hover text says which
/// value is lossless), and the rule selector.
fn rule_ui(s: &mut Settings, ui: &mut egui::Ui) {
    let param = s.rule.param();
    ui.horizontal(|ui| {
        let l = ui.label(param.name);
        ui.add(egui::Slider::new(&mut s.budget, param.range()).step_by(0.01))
            .labelled_by(l.id)
            .on_hover_text(param.meaning);
    });
    // One line whatever the number of rules: the Run button stays on screen at laptop sizes.
    egui::ComboBox::from_label("Rule").selected_text(s.rule.label()).show_ui(ui, |ui| {
        for rule in MentorRule::ALL {
            ui.selectable_value(&mut s.rule, rule, rule.label()).on_hover_text(rule.param().meaning);
        }
    });
    // A value valid for the rule before may not be for the one just chosen.
    let param = s.rule.param();
    s.budget = param.clamp(s.budget, param.lossless.unwrap_or(param.min));
}

/// A tree of candidates instead of a chain: its width here, its depth the draft length.
fn tree_ui(s: &mut Settings, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.checkbox(&mut s.tree, "draft a tree of candidates");
        let l = ui.label("Tree width");
        ui.add_enabled(s.tree, egui::DragValue::new(&mut s.tree_width).range(2..=MAX_TREE_WIDTH)).labelled_by(l.id);
    })
    .response
    .on_hover_text(
        "Each round the draft offers several candidates at every depth (as deep as the draft length), \
         and the target verifies the whole tree in one forward pass; each node is one more row of the \
         verify forward. Same seed: the draft's best few, and the walk follows the target's own token \
         down the tree; with the independent draft (or at budget 0) the text is exactly the chain's, so a \
         tree can only raise acceptance. Max acceptance: a draw without replacement from the draft, \
         checked in order by recursive rejection sampling, so the text still follows π exactly. The \
         feature draft's nodes read the features it predicted for their parents. With the adaptive \
         length the policy shapes each round's tree inside this width and the draft length. The inspector \
         shows, at each depth of a round, the candidates that were verified there.",
    );
}

fn sampling_ui(s: &mut Settings, ui: &mut egui::Ui) {
    ui.heading("Sampling");
    labelled(ui, "Temperature", &mut s.temperature, 0.0..=2.0, 0.05);
    labelled(ui, "Repetition penalty", &mut s.repeat_penalty, 1.0..=2.0, 0.05);
    labelled(ui, "Top-p", &mut s.top_p, 0.05..=1.0, 0.05);
    labelled(ui, "Max tokens", &mut s.max_tokens, 1..=1024, 1.0);
    ui.horizontal(|ui| {
        let l = ui.label("Seed");
        ui.add(egui::DragValue::new(&mut s.seed)).labelled_by(l.id);
        if ui.button("New seed").clicked() {
            s.seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000)
                .unwrap_or(0);
        }
    });
    ui.checkbox(&mut s.ignore_eos, "ignore end of sequence");
    ui.checkbox(&mut s.mark_divergence, "mark where the texts diverge");
}

fn run_stop_ui(app: &mut MentorApp, ui: &mut egui::Ui, busy: bool) {
    ui.horizontal(|ui| {
        let run = ui.add_enabled(!busy, egui::Button::new("Run")).on_hover_text("Ctrl/Cmd+Enter");
        if run.clicked() {
            app.queue(UiCommand::Run);
        }
        if ui.add_enabled(busy, egui::Button::new("Stop")).on_hover_text("Esc").clicked() {
            app.queue(UiCommand::Stop);
        }
        if busy {
            // A static label, not a spinner: a spinner repaints every frame and steals CPU from
            // the engine (docs/architecture.md, Threads).
            ui.weak("generating…");
        }
    });
}

fn sweep_ui(app: &mut MentorApp, ui: &mut egui::Ui, busy: bool) {
    ui.heading("Sweep");
    let s = &mut app.settings;
    ui.checkbox(&mut s.sweep_all_rules, "every rule, five values each").on_hover_text(
        "The rules' frontier: each rule over five values across its range, coloured by rule in the plot",
    );
    ui.add_enabled_ui(!s.sweep_all_rules, |ui| {
        ui.horizontal(|ui| {
            let l = ui.label("Budgets");
            ui.text_edit_singleline(&mut s.sweep_budgets).labelled_by(l.id);
        });
    });
    ui.horizontal(|ui| {
        let l = ui.label("Draft lengths");
        ui.text_edit_singleline(&mut s.sweep_lens).labelled_by(l.id);
    });
    ui.horizontal(|ui| {
        let l = ui.label("Seeds per point");
        ui.add(egui::DragValue::new(&mut s.sweep_seeds).range(1..=20)).labelled_by(l.id);
    });
    ui.horizontal(|ui| {
        if ui
            .add_enabled(!busy, egui::Button::new("Sweep"))
            .on_hover_text("Runs target-only and every budget × draft length on this prompt, for each seed (this seed and the next ones); every run goes into the runs table")
            .clicked()
        {
            app.queue(UiCommand::Sweep);
        }
        let sw = &app.view.sweep;
        if sw.total > 0 {
            ui.add(egui::ProgressBar::new(sw.done as f32 / sw.total as f32).text(format!("{}/{}", sw.done, sw.total)));
        }
    });
}
