//! Top bar: the models in use, Open… buttons, files found on disk, loading progress, errors.

use super::engine_thread::ModelChoice;
use super::{MentorApp, UiCommand};
use crate::gguf::ModelInfo;
use crate::models;

/// A model's name as the bar and the window title show it: the file's name (without a trailing
/// `.Q4_K_M`-style quantization) or the GGUF's `general.name`, whichever is shorter (names are
/// often training-run ids), cut to 32 characters.
pub fn short_name(info: &ModelInfo) -> String {
    let stem = info.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = match stem.rsplit_once('.') {
        Some((head, tail))
            if tail.eq_ignore_ascii_case(&info.quantization) || tail.starts_with(['Q', 'q', 'F', 'f']) =>
        {
            head.to_string()
        }
        _ => stem,
    };
    let name = [stem, info.name.clone()]
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .min_by_key(|s| s.chars().count())
        .unwrap_or_else(|| "model".to_string());
    match name.chars().count() > 32 {
        true => format!("{}…", name.chars().take(31).collect::<String>()),
        false => name,
    }
}

/// The full description, shown on hover: name, file, shape and formats.
fn describe_full(info: &ModelInfo, weights: &str) -> String {
    format!("{}\n{}\n{}", info.name, info.path.display(), describe(info, weights))
}

fn describe(info: &ModelInfo, weights: &str) -> String {
    format!(
        "{} · {}{} · {:.0}M params · {} → {} · {:.0} MB",
        short_name(info),
        info.arch,
        if info.feature_draft { " feature draft (reads the target's hidden states)" } else { "" },
        info.n_params as f64 / 1e6,
        info.quantization,
        weights,
        info.file_size as f64 / 1e6
    )
}

pub fn models_bar_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.add_space(4.0);
    ui.horizontal(|ui| target_line_ui(app, ui));
    ui.horizontal(|ui| draft_line_ui(app, ui));
    ui.horizontal(|ui| on_disk_line_ui(app, ui));
    if let Some(err) = app.view.error.clone() {
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, format!("Error: {err}"));
            if ui.small_button("Dismiss").clicked() {
                app.view.error = None;
            }
        });
    }
    ui.add_space(2.0);
}

/// The app's name, the loaded target, and the buttons that load another.
fn target_line_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.heading("Mentor Lab");
    ui.separator();
    ui.label("Target:");
    match &app.view.models.target {
        Some((info, w)) => ui
            .add(egui::Label::new(egui::RichText::new(describe(info, w)).monospace()).truncate())
            .on_hover_text(describe_full(info, w)),
        None => ui.weak("none loaded"),
    };
    if ui.button("Open target…").on_hover_text("Cmd/Ctrl+O").clicked() {
        app.queue(UiCommand::OpenTarget);
    }
    if ui.button("Default pair").on_hover_text("SmolLM2-135M-Instruct + the draft shipped with Mentor Lab").clicked() {
        app.queue(UiCommand::Load(ModelChoice { weights: app.settings.models.weights, ..ModelChoice::default() }));
    }
    super::pair_fetch::pair_buttons_ui(app, ui);
    ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
        if ui.button("About").clicked() {
            app.show_about = !app.show_about;
        }
    });
}

/// The loaded draft and the buttons that load another.
fn draft_line_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.add_space(118.0);
    ui.label("Draft: ");
    // The buttons first: a draft's description can be wider than the window.
    if ui.button("Open draft…").clicked() {
        app.queue(UiCommand::OpenDraft);
    }
    shipped_drafts_ui(app, ui);
    match &app.view.models.draft {
        // Cut to the window's width; the whole line shows on hover.
        Some((info, w)) => ui
            .add(egui::Label::new(egui::RichText::new(describe(info, w)).monospace()).truncate())
            .on_hover_text(describe_full(info, w)),
        None => ui.weak("none loaded"),
    };
}

/// The GGUF files found on disk: any as a target, those with the target's tokenizer as drafts;
/// the loading progress.
fn on_disk_line_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let target_fp = app
        .found
        .iter()
        .find(|f| app.view.models.target.as_ref().is_some_and(|(t, _)| t.path == f.info.path))
        .map(|f| f.tokenizer_fingerprint);
    egui::ComboBox::from_label("target on disk")
        .selected_text(format!("{} GGUF files found", app.found.len()))
        .show_ui(ui, |ui| {
            for f in app.found.clone() {
                if ui.selectable_label(false, f.info.path.display().to_string()).clicked() {
                    app.queue(UiCommand::Load(ModelChoice {
                        target: Some(f.info.path.clone()),
                        draft: None,
                        ..app.settings.models.clone()
                    }));
                }
            }
        });
    let compatible: Vec<_> = app
        .found
        .iter()
        .filter(|f| Some(f.tokenizer_fingerprint) == target_fp)
        .filter(|f| app.view.models.target.as_ref().is_none_or(|(t, _)| t.path != f.info.path))
        .cloned()
        .collect();
    egui::ComboBox::from_label("compatible drafts")
        .selected_text(format!("{} with the target's tokenizer", compatible.len()))
        .show_ui(ui, |ui| {
            for f in compatible {
                if ui
                    .selectable_label(
                        false,
                        format!("{} ({:.0}M)", f.info.path.display(), f.info.n_params as f64 / 1e6),
                    )
                    .clicked()
                {
                    app.queue(UiCommand::Load(ModelChoice {
                        draft: Some(f.info.path.clone()),
                        ..app.settings.models.clone()
                    }));
                }
            }
        });
    if ui.small_button("Rescan").clicked() {
        app.queue(UiCommand::Discover);
    }
    if app.view.models.loading {
        match &app.view.models.progress {
            Some((msg, Some(f))) => {
                ui.add(egui::ProgressBar::new(*f).desired_width(200.0).text(msg.clone()));
            }
            Some((msg, None)) => {
                ui.label(msg);
            }
            None => {
                ui.label("Loading models…");
            }
        }
    }
}

/// The two drafts shipped for the default target, one click apart: the independent draft (the
/// default pair's) and, where it ships (not in the Metal bundle), the feature draft. Shown only
/// while the default target is loaded, the one target the feature draft can read.
fn shipped_drafts_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let default_target = app
        .view
        .models
        .target
        .as_ref()
        .is_some_and(|(t, _)| t.path.file_name().is_some_and(|n| n == models::DEFAULT_TARGET_FILE));
    let Some((independent, feature)) = app.shipped_drafts.clone() else { return };
    if !default_target || app.view.models.loading {
        return;
    }
    let current = app.view.models.draft.as_ref().map(|(d, _)| d.path.clone());
    ui.label("Shipped:");
    let choices = [
        (independent, "independent", "Drafts from the tokens alone (the default pair's draft). Its text is the better one to follow at high TV budgets; it also runs on Metal."),
        (
            feature,
            "feature",
            "Reads the target's own hidden states, so each round's first token starts from what the target knew: at D = 0 on the CPU it is the faster one on prose and answers (on code the two are even). Followed deep at high budgets, its text costs more target likelihood. CPU only.",
        ),
    ];
    for (path, label, hover) in choices {
        let selected = current.as_ref() == Some(&path);
        if ui.selectable_label(selected, label).on_hover_text(hover).clicked() && !selected {
            app.queue(UiCommand::Load(ModelChoice { draft: Some(path), ..app.settings.models.clone() }));
        }
    }
    ui.separator();
}
