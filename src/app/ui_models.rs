//! Top bar: the models in use, Open… buttons, files found on disk, loading progress, errors.

use super::engine_thread::ModelChoice;
use super::{MentorApp, UiCommand};
use crate::gguf::ModelInfo;

fn describe(info: &ModelInfo, weights: &str) -> String {
    format!(
        "{} · {} · {:.0}M params · {} → {} · {:.0} MB",
        info.name,
        info.arch,
        info.n_params as f64 / 1e6,
        info.quantization,
        weights,
        info.file_size as f64 / 1e6
    )
}

pub fn models_bar_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.add_space(4.0);
    ui.horizontal(|ui| {
        ui.heading("Mentor Lab");
        ui.separator();
        ui.label("Target:");
        match &app.view.models.target {
            Some((info, w)) => ui.monospace(describe(info, w)),
            None => ui.weak("none loaded"),
        };
        if ui.button("Open target…").on_hover_text("Cmd/Ctrl+O").clicked() {
            app.queue(UiCommand::OpenTarget);
        }
        if ui.button("Default pair").on_hover_text("SmolLM2-135M-Instruct + the draft shipped with Mentor Lab").clicked() {
            app.queue(UiCommand::Load(ModelChoice { weights: app.settings.models.weights, ..ModelChoice::default() }));
        }
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if ui.button("About").clicked() {
                app.show_about = !app.show_about;
            }
        });
    });
    ui.horizontal(|ui| {
        ui.add_space(118.0);
        ui.label("Draft: ");
        match &app.view.models.draft {
            Some((info, w)) => ui.monospace(describe(info, w)),
            None => ui.weak("none loaded"),
        };
        if ui.button("Open draft…").clicked() {
            app.queue(UiCommand::OpenDraft);
        }
    });
    ui.horizontal(|ui| {
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
                        app.queue(UiCommand::Load(ModelChoice { target: Some(f.info.path.clone()), draft: None, ..app.settings.models.clone() }));
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
                    if ui.selectable_label(false, format!("{} ({:.0}M)", f.info.path.display(), f.info.n_params as f64 / 1e6)).clicked() {
                        app.queue(UiCommand::Load(ModelChoice { draft: Some(f.info.path.clone()), ..app.settings.models.clone() }));
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
    });
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
