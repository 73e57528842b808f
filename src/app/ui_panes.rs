//! The comparison: two panes of text with per-token provenance, the numbers of each run, and
//! live plots.

use super::view::PaneView;
use super::MentorApp;
use crate::generate::{TokenInfo, TokenSource};
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Legend, Line, Plot, PlotPoints};

/// Background colour of a token by provenance, readable in both themes.
pub fn source_color(source: TokenSource, dark: bool) -> Option<Color32> {
    let (r, g, b) = match source {
        TokenSource::DraftAccepted => (46, 160, 67),
        TokenSource::CopyAccepted => (150, 90, 210),
        TokenSource::Resampled => (219, 109, 40),
        TokenSource::Bonus => (56, 132, 244),
        TokenSource::Target | TokenSource::Draft => return None,
    };
    let alpha = if dark { 110 } else { 70 };
    Some(Color32::from_rgba_unmultiplied(r, g, b, alpha))
}

pub fn source_name(source: TokenSource) -> &'static str {
    match source {
        TokenSource::DraftAccepted => "draft token, accepted",
        TokenSource::CopyAccepted => "copied from the context, accepted",
        TokenSource::Resampled => "resampled after a rejection",
        TokenSource::Bonus => "bonus token from the target",
        TokenSource::Target => "target token",
        TokenSource::Draft => "draft token (draft-only)",
    }
}

/// The hover text of a token: every number behind its acceptance.
pub fn token_hover_text(t: &TokenInfo) -> String {
    let f = |name: &str, v: Option<f64>| v.map(|v| format!("{name} = {v:.4}\n")).unwrap_or_default();
    format!(
        "{:?} (id {}) · {}\n{}{}{}{}{}{}{}",
        t.text,
        t.id,
        source_name(t.source),
        f("p(x)", t.p_target.map(f64::from)),
        f("q(x)", t.q_draft.map(f64::from)),
        f("π(x)", t.pi_mixed.map(f64::from)),
        f("accept prob", t.accept_prob),
        f("d = TV(p,q)", t.tv),
        f("θ", t.theta),
        t.round.map(|r| format!("round {r}")).unwrap_or_default(),
    )
}

fn legend_ui(ui: &mut egui::Ui) {
    let dark = ui.visuals().dark_mode;
    ui.horizontal_wrapped(|ui| {
        for s in [TokenSource::DraftAccepted, TokenSource::CopyAccepted, TokenSource::Resampled, TokenSource::Bonus] {
            let color = source_color(s, dark).unwrap_or(Color32::TRANSPARENT);
            ui.label(RichText::new(format!(" {} ", source_name(s))).background_color(color));
        }
        ui.label(" target token (no highlight)");
    });
}

/// Where the two panes differ: the first position (underlined) and every later position whose
/// token differs from the other pane's token at the same position.
#[derive(Default)]
pub struct DiffMarks {
    pub first: Option<usize>,
    pub differ: Vec<bool>,
}

impl DiffMarks {
    fn differs(&self, i: usize) -> bool {
        self.differ.get(i).copied().unwrap_or(false)
    }
}

fn tokens_ui(ui: &mut egui::Ui, pane: &PaneView, marks: &DiffMarks) {
    let dark = ui.visuals().dark_mode;
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing = egui::vec2(0.0, 2.0);
        for (i, t) in pane.tokens.iter().enumerate() {
            let mut pieces = t.text.split('\n').peekable();
            while let Some(piece) = pieces.next() {
                if !piece.is_empty() {
                    let mut rt = RichText::new(piece);
                    if let Some(c) = source_color(t.source, dark) {
                        rt = rt.background_color(c);
                    }
                    if marks.first == Some(i) {
                        rt = rt.underline().strong().color(ui.visuals().error_fg_color);
                    } else if marks.differs(i) {
                        rt = rt.color(ui.visuals().error_fg_color);
                    }
                    ui.add(egui::Label::new(rt).sense(egui::Sense::hover())).on_hover_text(token_hover_text(t));
                }
                if pieces.peek().is_some() {
                    ui.end_row();
                }
            }
        }
        if pane.running {
            ui.weak(" …");
        }
    });
}

fn pane_ui(ui: &mut egui::Ui, title: &str, pane: &PaneView, marks: &DiffMarks) {
    ui.strong(title);
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_min_height(220.0);
        ui.set_width(ui.available_width());
        egui::ScrollArea::vertical().id_salt(title).max_height(320.0).stick_to_bottom(true).show(ui, |ui| {
            if pane.tokens.is_empty() && !pane.running {
                ui.weak("Press Run (Ctrl/Cmd+Enter) to generate.");
            }
            tokens_ui(ui, pane, marks);
        });
    });
}

pub fn comparison_ui(app: &mut MentorApp, ui: &mut egui::Ui) {
    let divergence = app.view.divergence();
    let differing = app.view.differing_positions();
    let marks = match app.settings.mark_divergence {
        true => {
            let n = app.view.target.tokens.len().max(app.view.mentored.tokens.len());
            let mut differ = vec![false; n];
            differing.iter().for_each(|&i| differ[i] = true);
            DiffMarks { first: divergence, differ }
        }
        false => DiffMarks::default(),
    };
    let mentored_title = if app.view.mentored_label.is_empty() {
        format!("Mentored ({})", app.settings.mentored_label())
    } else {
        format!("Mentored ({})", app.view.mentored_label)
    };
    legend_ui(ui);
    ui.columns(2, |cols| {
        pane_ui(&mut cols[0], "Target only", &app.view.target, &marks);
        pane_ui(&mut cols[1], &mentored_title, &app.view.mentored, &marks);
    });
    if app.settings.mark_divergence {
        if let Some(line) = divergence_line(&app.view, divergence, differing.len()) {
            ui.weak(line);
        }
    }
    ui.add_space(6.0);
    stats_ui(ui, &app.view.target, &app.view.mentored);
    ui.add_space(6.0);
    plots_ui(ui, &app.view.target, &app.view.mentored);
}

/// One line saying where the panes differ, or that they are identical.
fn divergence_line(view: &super::view::ViewState, first: Option<usize>, n_differing: usize) -> Option<String> {
    let (a, b) = (view.target.tokens.len(), view.mentored.tokens.len());
    let done = !view.target.running && !view.mentored.running;
    match first {
        None if done && a > 0 && a == b => Some(format!("The two texts are identical, token for token ({a} tokens).")),
        None => None,
        Some(i) => {
            let later = n_differing.saturating_sub(usize::from(i < a.min(b)));
            let lengths = if done && a != b { format!(" The texts have {a} and {b} tokens.") } else { String::new() };
            Some(format!(
                "The texts first differ at output token {i} (underlined). After it each pane continues its own \
                 text, so later tokens are compared by position only: {later} later {} (red).{lengths}",
                if later == 1 { "position differs" } else { "positions differ" }
            ))
        }
    }
}

fn stats_ui(ui: &mut egui::Ui, target: &PaneView, mentored: &PaneView) {
    let num = |v: Option<f64>, digits: usize, unit: &str| match v {
        Some(x) if x.is_finite() => RichText::new(format!("{x:.digits$}{unit}")).monospace(),
        _ => RichText::new("–").monospace(),
    };
    let t = target.stats.as_ref();
    let m = mentored.stats.as_ref();
    let tok_s =
        |s: Option<&crate::generate::Stats>| s.map(|s| if s.e2e_s > 0.0 { s.n_tokens as f64 / s.e2e_s } else { 0.0 });
    let speedup = match (t, m) {
        (Some(t), Some(m)) if m.e2e_s > 0.0 => Some(t.e2e_s / m.e2e_s),
        _ => None,
    };
    // (row label, target-only value, mentored value, decimals, unit)
    let copied = m.filter(|s| s.n_drafted > 0).map(|s| 100.0 * s.n_copied as f64 / s.n_drafted as f64);
    let rows: [(&str, Option<f64>, Option<f64>, usize, &str); 9] = [
        ("end-to-end", t.map(|s| s.e2e_s), m.map(|s| s.e2e_s), 2, " s"),
        ("tokens / s", tok_s(t), tok_s(m), 1, ""),
        ("speedup vs target-only", t.map(|_| 1.0), speedup, 2, "×"),
        ("acceptance rate", None, m.map(|s| 100.0 * s.acceptance_rate), 1, " %"),
        ("drafted tokens copied from the context", None, copied, 1, " %"),
        ("τ (tokens per round)", None, m.map(|s| s.mean_accepted_len), 2, ""),
        ("rounds", None, m.map(|s| s.n_rounds as f64), 0, ""),
        ("mean target NLL (quality)", t.map(|s| s.mean_target_nll), m.map(|s| s.mean_target_nll), 3, ""),
        ("mean realised TV(π, p)", None, m.map(|s| s.mean_tv), 3, ""),
    ];
    const WIDTHS: [f32; 3] = [250.0, 90.0, 90.0];
    super::table_row(ui, &WIDTHS, false, |i, ui| {
        ui.strong(["", "Target only", "Mentored"][i]);
    });
    for (row, (label, target_value, mentored_value, digits, unit)) in rows.into_iter().enumerate() {
        super::table_row(ui, &WIDTHS, row % 2 == 0, |i, ui| {
            let text = match i {
                0 => RichText::new(label),
                1 => num(target_value, digits, unit),
                _ => num(mentored_value, digits, unit),
            };
            ui.add(egui::Label::new(text).truncate());
        });
    }
}

/// Seconds over which the live rate plot counts tokens.
const RATE_WINDOW_S: f64 = 0.5;

fn plots_ui(ui: &mut egui::Ui, target: &PaneView, mentored: &PaneView) {
    let progress = |p: &PaneView| -> Vec<[f64; 2]> {
        std::iter::once([0.0, 0.0]).chain(p.token_times.iter().enumerate().map(|(i, &t)| [t, (i + 1) as f64])).collect()
    };
    let h = 170.0;
    // The wheel scrolls the page, not the plots: over a plot it panned the live data out of view.
    ui.columns(3, |cols| {
        cols[0].label("Tokens generated vs seconds");
        Plot::new("progress").height(h).allow_scroll(false).legend(Legend::default()).x_axis_label("s").show(
            &mut cols[0],
            |p| {
                p.line(Line::new("target only", PlotPoints::new(progress(target))));
                p.line(Line::new("mentored", PlotPoints::new(progress(mentored))));
            },
        );
        cols[1].label(format!("Tokens / s (last {RATE_WINDOW_S} s)"));
        Plot::new("rate").height(h).allow_scroll(false).legend(Legend::default()).x_axis_label("s").show(
            &mut cols[1],
            |p| {
                p.line(Line::new("target only", PlotPoints::new(target.rolling_tok_s(RATE_WINDOW_S))));
                p.line(Line::new("mentored", PlotPoints::new(mentored.rolling_tok_s(RATE_WINDOW_S))));
            },
        );
        cols[2].label("Accepted / drafted per round");
        Plot::new("acceptance").height(h).allow_scroll(false).x_axis_label("round").include_y(0.0).include_y(1.0).show(
            &mut cols[2],
            |p| {
                let bars: Vec<Bar> = mentored
                    .rounds
                    .iter()
                    .filter(|(r, _)| r.n_proposed > 0)
                    .map(|(r, _)| Bar::new(r.index as f64, r.n_accepted as f64 / r.n_proposed as f64).width(0.8))
                    .collect();
                p.bar_chart(BarChart::new("acceptance", bars));
            },
        );
    });
}
