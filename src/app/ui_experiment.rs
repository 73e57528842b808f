//! The article's experiment in one click: its configurations over seeds × repeats on the current
//! prompt, a table of medians and a chart of speedups with their spread, the published numbers
//! beside them for reference.

use super::view::{ExperimentRow, ARTICLE_REFERENCE};
use super::{MentorApp, UiCommand};
use egui::{Color32, RichText};
use egui_plot::{BoxElem, BoxPlot, BoxSpread, PlotPoints, Points};

const OURS: Color32 = Color32::from_rgb(230, 120, 40);
const ARTICLE: Color32 = Color32::from_rgb(120, 120, 200);

pub fn experiment_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let busy = app.view.busy() || app.view.sweep.run_id.is_some() || app.view.experiment.run_id.is_some();
    ui.horizontal(|ui| {
        let s = &mut app.settings;
        let l = ui.label("Seeds");
        ui.add(egui::DragValue::new(&mut s.experiment_seeds).range(1..=50)).labelled_by(l.id);
        let l = ui.label("Repeats");
        ui.add(egui::DragValue::new(&mut s.experiment_repeats).range(1..=20)).labelled_by(l.id);
        let n_runs = 1 + super::view::ARTICLE_CONFIGS.len() as u64 * s.experiment_seeds * s.experiment_repeats as u64;
        let hover = format!(
            "Target-only, fixed k = 4/6/8 at TV 1, fixed 8 at TV 0.75 and 0.5, and lossless adaptive drafting, \
             on this prompt with {} tokens each (end of sequence ignored): {n_runs} runs after a warm-up. Stop ends it.",
            s.max_tokens
        );
        if ui.add_enabled(!busy, egui::Button::new("Run the article's experiment")).on_hover_text(hover).clicked() {
            app.queue(UiCommand::Experiment);
        }
        ui.weak(duration_note(app, n_runs));
        let ex = &app.view.experiment;
        if !ex.plan.is_empty() {
            let (done, total) = (ex.done(), ex.plan.len());
            ui.add(egui::ProgressBar::new(done as f32 / total as f32).text(format!("{done}/{total}")));
        }
    });
    let rows = app.view.experiment.summary();
    if rows.is_empty() {
        ui.weak(
            "The reference article compared these configurations on Qwen2.5 7B + 0.5B on an Apple M2; \
             this runs them on the loaded pair and this machine.",
        );
        return;
    }
    ui.label(format!("On {}", app.view.experiment.models));
    ui.columns(2, |cols| {
        table_ui(&mut cols[0], &rows);
        chart_ui(&mut cols[1], &rows);
    });
}

/// How long the experiment would take: its tokens at the loaded target's last target-only speed
/// (mentored runs take about as long or less).
fn duration_note(app: &MentorApp, n_runs: u64) -> String {
    let (target, _) = app.run_models(false);
    let last = app.history.iter().rev().find(|r| r.config == "target" && r.target == target && r.tok_s > 0.0);
    match last {
        Some(r) => {
            let seconds = (n_runs + 1) as f64 * app.settings.max_tokens as f64 / r.tok_s;
            format!("≈ {:.0} min at {:.1} tok/s (this target's last run)", (seconds / 60.0).ceil(), r.tok_s)
        }
        None => "Run a comparison first to see how long it takes.".into(),
    }
}

fn table_ui(ui: &mut egui::Ui, rows: &[ExperimentRow]) {
    const HEADERS: [&str; 7] = ["config", "runs", "accepted", "rounds", "median e2e", "speedup (quartiles)", "NLL"];
    const WIDTHS: [f32; 7] = [110.0, 40.0, 66.0, 52.0, 76.0, 140.0, 52.0];
    egui::ScrollArea::vertical().id_salt("experiment table").show(ui, |ui| {
        super::table_row(ui, &WIDTHS, false, |i, ui| {
            ui.strong(HEADERS[i]);
        });
        let mono = |s: String| RichText::new(s).monospace();
        for (n, r) in rows.iter().enumerate() {
            super::table_row(ui, &WIDTHS, n % 2 == 0, |i, ui| {
                let text = match i {
                    0 => RichText::new(&r.label),
                    1 => mono(r.n_runs.to_string()),
                    2 => mono(r.acceptance.map(|a| format!("{:.1}%", 100.0 * a)).unwrap_or_else(|| "–".into())),
                    3 => mono(r.mean_rounds.map(|x| format!("{x:.1}")).unwrap_or_else(|| "–".into())),
                    4 => mono(format!("{:.2} s", r.median_e2e_s)),
                    5 => mono(match r.speedup {
                        Some([_, q1, m, q3, _]) => format!("{m:.2}× ({q1:.2}–{q3:.2})"),
                        None => "–".into(),
                    }),
                    _ => mono(format!("{:.3}", r.mean_target_nll)),
                };
                ui.add(egui::Label::new(text).truncate());
            });
        }
        ui.add_space(4.0);
        ui.weak("The article (Qwen2.5 7B + 0.5B, Apple M2, creative, T = 0.7, 256 tokens; another machine and pair):");
        for (label, e2e, acceptance) in ARTICLE_REFERENCE {
            let speedup = ARTICLE_REFERENCE[0].1 / e2e;
            let acc = acceptance.map(|a| format!(", {:.1}% accepted", 100.0 * a)).unwrap_or_default();
            ui.weak(format!("  {label}: {e2e:.2} s, {speedup:.2}×{acc}"));
        }
    });
}

/// Speedup per configuration: a box from the lower to the upper quartile of the paired ratios,
/// whiskers to the extremes; the article's speedups as points.
fn chart_ui(ui: &mut egui::Ui, rows: &[ExperimentRow]) {
    ui.horizontal(|ui| {
        ui.label(RichText::new("speedup vs target-only here").color(OURS));
        ui.label(RichText::new("points: the article").color(ARTICLE));
    });
    let labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
    let boxes: Vec<BoxElem> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let [lo, q1, m, q3, hi] = r.speedup?;
            Some(BoxElem::new(i as f64, BoxSpread::new(lo, q1, m, q3, hi)).name(&r.label).box_width(0.5))
        })
        .collect();
    let article: Vec<[f64; 2]> = ARTICLE_REFERENCE
        .iter()
        .filter_map(|(label, e2e, _)| {
            let i = rows.iter().position(|r| r.label == *label)?;
            Some([i as f64, ARTICLE_REFERENCE[0].1 / e2e])
        })
        .collect();
    super::ui_panes::category_plot("experiment speedups", labels).y_axis_label("speedup ×").show(ui, |p| {
        p.box_plot(BoxPlot::new("here", boxes).color(OURS));
        p.points(Points::new("the article", PlotPoints::new(article)).radius(4.0).color(ARTICLE));
    });
}
