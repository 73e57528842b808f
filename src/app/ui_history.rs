//! Bottom panel: the runs table (kept across restarts, exportable) and the sweep's
//! speed/quality frontier.

use super::view::BottomTab;
use super::{MentorApp, UiCommand};
use egui::RichText;
use egui_plot::{HoverPosition, Line, Plot, PlotPoint, PlotPoints, Points, Text};

/// The bottom panel: tabs for the runs and sweep, and the token inspector.
pub fn bottom_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    // Keep the panel's height whatever the tab shows (a short tab would shrink it).
    ui.set_min_height(ui.available_height());
    ui.horizontal(|ui| {
        let tab = &mut app.view.bottom_tab;
        ui.selectable_value(tab, BottomTab::Runs, "Runs and sweep");
        ui.selectable_value(tab, BottomTab::Inspector, "Token inspector");
        ui.selectable_value(tab, BottomTab::Experiment, "The article's experiment");
        ui.selectable_value(tab, BottomTab::Spend, "Where the budget goes");
    });
    match app.view.bottom_tab {
        BottomTab::Runs => history_ui(app, ui),
        BottomTab::Inspector => super::ui_inspector::inspector_ui(app, ui),
        BottomTab::Experiment => super::ui_experiment::experiment_ui(app, ui),
        BottomTab::Spend => spend_ui(app, ui),
    }
}

fn history_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
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
        const HEADERS: [&str; 9] =
            ["models", "config", "acceptance", "rounds", "e2e s", "tok/s", "speedup", "target NLL", "seed"];
        const WIDTHS: [f32; 9] = [150.0, 124.0, 74.0, 50.0, 46.0, 50.0, 56.0, 70.0, 40.0];
        super::table_row(ui, &WIDTHS, false, |i, ui| {
            ui.strong(HEADERS[i]);
        });
        let mono = |s: String| RichText::new(s).monospace();
        for (row, r) in app.history.iter().enumerate() {
            let not_target =
                |s: String| if r.config == "target" || r.config == "sweep: target" { "–".to_string() } else { s };
            super::table_row(ui, &WIDTHS, row % 2 == 0, |i, ui| {
                let text = match i {
                    0 => RichText::new(models_of(r)),
                    1 => RichText::new(&r.config),
                    2 => mono(not_target(format!("{:.1}%", 100.0 * r.acceptance))),
                    3 => mono(not_target(r.rounds.to_string())),
                    4 => mono(format!("{:.2}", r.e2e_s)),
                    5 => mono(format!("{:.1}", r.tok_s)),
                    6 => mono(if r.speedup.is_finite() { format!("{:.2}×", r.speedup) } else { "–".into() }),
                    7 => mono(format!("{:.3}", r.target_nll)),
                    _ => mono(r.seed.to_string()),
                };
                let cell = ui.add(egui::Label::new(text).truncate());
                match i {
                    0 => drop(cell.on_hover_text(format!("target: {}\ndraft: {}", r.target, r.draft))),
                    1 => drop(cell.on_hover_text(&r.prompt)),
                    _ => {}
                }
            });
        }
    });
}

/// The run's models in a cell: "target + draft", or the target alone.
fn models_of(r: &crate::app::view::RunRecord) -> String {
    match (r.target.as_str(), r.draft.as_str()) {
        ("", _) => "–".into(),
        (t, "") => t.to_string(),
        (t, d) => format!("{t} + {d}"),
    }
}

/// Each drafted position of the last comparisons: d = TV(p, q) against the TV(π, p) the rule
/// spent there, one colour per rule. The TV rule lies on min(d, D); the others show their shape.
fn spend_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    if app.view.spend.is_empty() {
        ui.weak("Run comparisons under different rules: each drafted position appears here at its d = TV(p, q) and the TV(π, p) the rule spent there.");
        return;
    }
    Plot::new("spend")
        .x_axis_label("d = TV(p, q)")
        .y_axis_label("realised TV(π, p)")
        .include_x(0.0)
        .include_x(1.0)
        .include_y(0.0)
        .include_y(1.0)
        .allow_scroll(false)
        .legend(egui_plot::Legend::default())
        .show(ui, |p| {
            p.line(Line::new("", PlotPoints::new(vec![[0.0, 0.0], [1.0, 1.0]])).color(egui::Color32::GRAY).width(0.5));
            for run in &app.view.spend {
                let color = rule_color(Some(run.rule));
                p.points(Points::new(run.label.clone(), PlotPoints::new(run.points.clone())).radius(2.0).color(color));
            }
        });
}

/// One colour per rule on the frontier (grey for target-only).
pub(crate) fn rule_color(rule: Option<crate::mentor::MentorRule>) -> egui::Color32 {
    use crate::mentor::MentorRule as R;
    match rule {
        None => egui::Color32::GRAY,
        Some(R::Tv) => egui::Color32::from_rgb(230, 120, 40),
        Some(R::Kl) => egui::Color32::from_rgb(60, 130, 210),
        Some(R::Cascade) => egui::Color32::from_rgb(60, 170, 90),
        Some(R::Fuzzy) => egui::Color32::from_rgb(170, 80, 200),
        Some(R::Typical) => egui::Color32::from_rgb(200, 60, 80),
        Some(R::Lenience) => egui::Color32::from_rgb(150, 120, 40),
    }
}

/// Each configuration at its median (target NLL, speedup) over the sweep's seeds, with whiskers
/// from the smallest to the largest value on both axes; the legend sits outside the data.
fn frontier_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let pts = app.view.sweep.frontier();
    ui.horizontal_wrapped(|ui| {
        ui.strong("Sweep: speedup vs target NLL (medians over seeds; whiskers: min to max)");
        for rule in crate::mentor::MentorRule::ALL {
            if pts.iter().any(|f| f.rule == Some(rule)) {
                ui.label(RichText::new(rule.key()).color(rule_color(Some(rule))));
            }
        }
    });
    Plot::new("frontier")
        .x_axis_label("mean target NLL (lower is closer to the target)")
        .y_axis_label("speedup ×")
        .allow_scroll(false)
        .label_formatter(|pos| match pos {
            HoverPosition::NearDataPoint { plot_name, position, .. } if !plot_name.is_empty() => {
                Some(format!("{plot_name}\nNLL {:.3}, speedup {:.2}×", position.x, position.y))
            }
            _ => None,
        })
        .show(ui, |p| {
            for f in &pts {
                let [n_lo, n_mid, n_hi] = f.nll;
                let [s_lo, s_mid, s_hi] = f.speedup;
                let name = format!("{} ({} seeds)", f.label, f.n_seeds);
                let color = rule_color(f.rule);
                p.line(Line::new("", PlotPoints::new(vec![[n_lo, s_mid], [n_hi, s_mid]])).width(1.0).color(color));
                p.line(Line::new("", PlotPoints::new(vec![[n_mid, s_lo], [n_mid, s_hi]])).width(1.0).color(color));
                p.points(Points::new(name, PlotPoints::new(vec![[n_mid, s_mid]])).radius(4.0).color(color));
                p.text(
                    Text::new("", PlotPoint::new(n_mid, s_mid), RichText::new(format!("  {}", f.label)).small())
                        .anchor(egui::Align2::LEFT_BOTTOM),
                );
            }
        });
}
