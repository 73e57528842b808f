//! Bottom panel: the runs table (kept across restarts, exportable) and the sweep's
//! speed/quality frontier.

use super::{MentorApp, UiCommand};
use egui::RichText;
use egui_plot::{Legend, Plot, PlotPoint, PlotPoints, Points, Text};

pub fn history_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.columns(2, |cols| {
        runs_table_ui(app, &mut cols[0]);
        frontier_ui(app, &mut cols[1]);
    });
}

fn runs_table_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.strong(format!("Runs ({})", app.history.len()));
        if ui.button("Export CSV…").clicked() {
            app.queue(UiCommand::ExportCsv);
        }
        if ui.button("Export JSON…").clicked() {
            app.queue(UiCommand::ExportJson);
        }
        if ui.button("Clear").clicked() {
            app.queue(UiCommand::ClearHistory);
        }
        if let Some(p) = &app.last_export {
            ui.weak(format!("saved {}", p.display()));
        }
    });
    egui::ScrollArea::both().id_salt("runs").stick_to_bottom(true).show(ui, |ui| {
        egui::Grid::new("runs-grid").striped(true).num_columns(8).show(ui, |ui| {
            for h in ["config", "acceptance", "rounds", "e2e s", "tok/s", "speedup", "target NLL", "seed"] {
                ui.strong(h);
            }
            ui.end_row();
            let mono = |s: String| RichText::new(s).monospace();
            for r in &app.history {
                ui.label(&r.config).on_hover_text(&r.prompt);
                ui.label(mono(if r.config == "target" { "–".into() } else { format!("{:.1}%", 100.0 * r.acceptance) }));
                ui.label(mono(if r.config == "target" { "–".into() } else { r.rounds.to_string() }));
                ui.label(mono(format!("{:.2}", r.e2e_s)));
                ui.label(mono(format!("{:.1}", r.tok_s)));
                ui.label(mono(if r.speedup.is_finite() { format!("{:.2}×", r.speedup) } else { "–".into() }));
                ui.label(mono(format!("{:.3}", r.target_nll)));
                ui.label(mono(r.seed.to_string()));
                ui.end_row();
            }
        });
    });
}

fn frontier_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    ui.strong("Sweep: speedup vs target NLL (the speed/quality frontier)");
    let pts = app.view.sweep.frontier();
    Plot::new("frontier").legend(Legend::default()).x_axis_label("mean target NLL (lower is closer to the target)").y_axis_label("speedup ×").show(ui, |p| {
        if pts.is_empty() {
            return;
        }
        let xy: Vec<[f64; 2]> = pts.iter().map(|(x, y, _)| [*x, *y]).collect();
        p.points(Points::new("configs", PlotPoints::new(xy)).radius(4.0));
        for (x, y, label) in &pts {
            p.text(Text::new(label.clone(), PlotPoint::new(*x, *y), RichText::new(label.clone()).small()));
        }
    });
}
