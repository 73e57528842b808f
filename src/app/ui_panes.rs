//! The comparison: two panes of text with per-token provenance, the numbers of each run, and
//! live plots.

use super::engine_thread::Pane;
use super::view::PaneView;
use super::{MentorApp, UiCommand};
use crate::generate::{TokenInfo, TokenSource};
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Line, Plot, PlotPoints};

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

/// Colours of the two runs in the live plots (and their legend, drawn above the plots so that no
/// legend covers data).
const TARGET_COLOR: Color32 = Color32::from_rgb(70, 130, 230);
const MENTORED_COLOR: Color32 = Color32::from_rgb(230, 120, 40);
/// Surprise (−log p at T = 1, nats) at which the shading is darkest.
const MAX_SURPRISE: f64 = 8.0;

/// Background of a token shaded by the target's surprise at it.
pub fn surprise_color(nll: Option<f64>, dark: bool) -> Option<Color32> {
    let s = (nll? / MAX_SURPRISE).clamp(0.0, 1.0);
    let alpha = ((if dark { 200.0 } else { 150.0 }) * s) as u8;
    (alpha > 4).then(|| Color32::from_rgba_unmultiplied(220, 40, 60, alpha))
}

fn legend_ui(ui: &mut egui::Ui, shade_surprise: &mut bool) {
    let dark = ui.visuals().dark_mode;
    ui.horizontal_wrapped(|ui| {
        if *shade_surprise {
            ui.label("Target's surprise -log p(x):");
            for nll in [0.0, 2.0, 4.0, 6.0, 8.0] {
                let c = surprise_color(Some(nll), dark).unwrap_or(Color32::TRANSPARENT);
                let text = if nll >= MAX_SURPRISE { format!(" {nll:.0}+ ") } else { format!(" {nll:.0} ") };
                ui.label(RichText::new(text).monospace().background_color(c));
            }
            ui.label("nats");
        } else {
            for s in [TokenSource::DraftAccepted, TokenSource::CopyAccepted, TokenSource::Resampled, TokenSource::Bonus] {
                let color = source_color(s, dark).unwrap_or(Color32::TRANSPARENT);
                ui.label(RichText::new(format!(" {} ", source_name(s))).background_color(color));
            }
            ui.label(" target token (no highlight)");
        }
        ui.separator();
        ui.checkbox(shade_surprise, "shade by surprise")
            .on_hover_text("Shade every token by −log p(x) under the target at T = 1: where following the draft wrote what the target would rarely have written. Click a token to inspect it.");
    });
}

/// Where the two panes differ: the first position (in the error colour, underlined) and every later position whose
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

/// What a token's background says: provenance, or the target's surprise.
#[derive(Clone, Copy)]
enum Shading {
    Provenance,
    Surprise,
}

fn tokens_ui(
    ui: &mut egui::Ui,
    pane: &PaneView,
    marks: &DiffMarks,
    shading: Shading,
    pinned: Option<usize>,
) -> Option<usize> {
    let dark = ui.visuals().dark_mode;
    let mut clicked = None;
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing = egui::vec2(0.0, 2.0);
        for (i, t) in pane.tokens.iter().enumerate() {
            let mut pieces = t.text.split('\n').peekable();
            while let Some(piece) = pieces.next() {
                if !piece.is_empty() {
                    let mut rt = RichText::new(piece);
                    let bg = match shading {
                        Shading::Provenance => source_color(t.source, dark),
                        Shading::Surprise => surprise_color(t.nll, dark),
                    };
                    if let Some(c) = bg {
                        rt = rt.background_color(c);
                    }
                    // The first difference in the error colour, later ones underlined (colouring
                    // every later token would leave a diverged text unreadable).
                    if marks.first == Some(i) {
                        rt = rt.underline().strong().color(ui.visuals().error_fg_color);
                    } else if marks.differs(i) {
                        rt = rt.underline();
                    }
                    let r = ui.add(egui::Label::new(rt).sense(egui::Sense::click()));
                    if pinned == Some(i) {
                        ui.painter().rect_stroke(
                            r.rect.expand(1.0),
                            2.0,
                            ui.visuals().selection.stroke,
                            egui::StrokeKind::Outside,
                        );
                    }
                    if r.clicked() {
                        clicked = Some(i);
                    }
                    r.on_hover_text(token_hover_text(t));
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
    clicked
}

fn pane_ui(
    ui: &mut egui::Ui,
    title: &str,
    pane: &PaneView,
    marks: &DiffMarks,
    shading: Shading,
    pinned: Option<usize>,
    height: f32,
) -> Option<usize> {
    ui.strong(title);
    let mut clicked = None;
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_min_height(height);
        ui.set_width(ui.available_width());
        egui::ScrollArea::vertical().id_salt(title).max_height(height).stick_to_bottom(true).show(ui, |ui| {
            if pane.tokens.is_empty() && !pane.running {
                ui.weak("Press Run (Ctrl/Cmd+Enter) to generate.");
            }
            clicked = tokens_ui(ui, pane, marks, shading, pinned);
        });
    });
    clicked
}

/// Height of each live plot where there is room; never below [`MIN_PLOT_HEIGHT`], which keeps
/// axes and lines readable.
pub const PLOT_HEIGHT: f32 = 200.0;
pub const MIN_PLOT_HEIGHT: f32 = 160.0;
/// The smallest height the text panes get before the central area scrolls.
const MIN_PANE_HEIGHT: f32 = 96.0;

/// The comparison. `height` is the central area's visible height: the panes take what the
/// stats and the plots leave, so that the plots stay on screen.
pub fn comparison_ui(app: &mut MentorApp, ui: &mut egui::Ui, height: f32) {
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
    let top = ui.cursor().top();
    legend_ui(ui, &mut app.settings.shade_surprise);
    let shading = if app.settings.shade_surprise { Shading::Surprise } else { Shading::Provenance };
    // Above the panes: the legend (measured) and the panes' titles and frames. Below them: last
    // frame's measure, or an estimate of the divergence line, the stats table (3 rows) and the
    // plots' legend, titles and axes at first.
    let row = ui.text_style_height(&egui::TextStyle::Body) + ui.spacing().item_spacing.y;
    let above = ui.cursor().top() - top + row + 16.0;
    let below = app.view.layout.below_panes_h.unwrap_or(8.0 * row + 40.0);
    let room = height - above - below;
    let plot_h = (room - MIN_PANE_HEIGHT).clamp(MIN_PLOT_HEIGHT, PLOT_HEIGHT);
    let pane_h = (room - plot_h).max(MIN_PANE_HEIGHT);
    let pin = |pane| app.view.pinned.filter(|(p, _)| *p == pane).map(|(_, i)| i);
    let (pin_t, pin_m) = (pin(Pane::Target), pin(Pane::Mentored));
    let mut clicked = None;
    ui.columns(2, |cols| {
        if let Some(i) = pane_ui(&mut cols[0], "Target only", &app.view.target, &marks, shading, pin_t, pane_h) {
            clicked = Some((Pane::Target, i));
        }
        if let Some(i) = pane_ui(&mut cols[1], &mentored_title, &app.view.mentored, &marks, shading, pin_m, pane_h) {
            clicked = Some((Pane::Mentored, i));
        }
    });
    if let Some((pane, i)) = clicked {
        app.queue(UiCommand::Pin(pane, i));
    }
    let line = match app.settings.mark_divergence {
        true => divergence_line(&app.view, divergence, differing.len()),
        false => None,
    };
    let panes_bottom = ui.cursor().top();
    ui.weak(line.unwrap_or_default());
    stats_ui(ui, &app.view.target, &app.view.mentored);
    app.view.layout.plot_rects = plots_ui(ui, &app.view.target, &app.view.mentored, plot_h);
    app.view.layout.below_panes_h = Some(ui.cursor().top() - panes_bottom - plot_h);
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
                "The texts first differ at output token {i} (in red). After it each pane continues its own \
                 text, so later tokens are compared by position only: {later} later {} (underlined).{lengths}",
                if later == 1 { "position differs" } else { "positions differ" }
            ))
        }
    }
}

/// The numbers of both runs side by side: one row per run, one column per quantity.
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
    let copied = m.filter(|s| s.n_drafted > 0).map(|s| 100.0 * s.n_copied as f64 / s.n_drafted as f64);
    // (column header, its explanation, target-only value, mentored value, decimals, unit)
    type Column<'a> = (&'a str, &'a str, Option<f64>, Option<f64>, usize, &'a str);
    let columns: [Column; 9] = [
        ("e2e", "end-to-end time", t.map(|s| s.e2e_s), m.map(|s| s.e2e_s), 2, " s"),
        ("tok/s", "tokens per second, end to end", tok_s(t), tok_s(m), 1, ""),
        ("speedup", "speedup vs target-only", t.map(|_| 1.0), speedup, 2, "×"),
        ("accepted", "acceptance rate of drafted tokens", None, m.map(|s| 100.0 * s.acceptance_rate), 1, "%"),
        ("copied", "drafted tokens copied from the context", None, copied, 1, "%"),
        ("τ", "tokens per round", None, m.map(|s| s.mean_accepted_len), 2, ""),
        ("rounds", "draft + verify rounds", None, m.map(|s| s.n_rounds as f64), 0, ""),
        (
            "target NLL",
            "mean -log p(x) under the target at T = 1 (quality: lower is closer to the target)",
            t.map(|s| s.mean_target_nll),
            m.map(|s| s.mean_target_nll),
            3,
            "",
        ),
        ("TV(π,p)", "mean realised TV(π, p): what the budget bought", None, m.map(|s| s.mean_tv), 3, ""),
    ];
    let mut widths = vec![100.0];
    widths.extend([70.0, 58.0, 62.0, 70.0, 60.0, 50.0, 56.0, 80.0, 68.0]);
    super::table_row(ui, &widths, false, |i, ui| match i {
        0 => {}
        i => {
            let (name, help, ..) = columns[i - 1];
            ui.strong(name).on_hover_text(help);
        }
    });
    for (row, name) in ["Target only", "Mentored"].into_iter().enumerate() {
        super::table_row(ui, &widths, row == 0, |i, ui| {
            let text = match i {
                0 => RichText::new(name),
                i => {
                    let (_, _, tv, mv, digits, unit) = columns[i - 1];
                    num(if row == 0 { tv } else { mv }, digits, unit)
                }
            };
            ui.add(egui::Label::new(text).truncate());
        });
    }
}

/// A fixed plot (no scroll, drag or zoom) from 0 to at least 1 on y whose x axis names one
/// category per integer position, `labels[j]` at x = j: the inspector's tokens, the experiment's
/// configurations.
pub fn category_plot<'a>(id: &str, labels: Vec<String>) -> Plot<'a> {
    Plot::new(id)
        .allow_scroll(false)
        .allow_drag(false)
        .allow_zoom(false)
        .include_y(0.0)
        .include_y(1.0)
        .x_grid_spacer(|input| {
            let (lo, hi) = input.bounds;
            (lo.ceil().max(0.0) as i64..=hi.floor() as i64)
                .map(|j| egui_plot::GridMark { value: j as f64, step_size: 1.0 })
                .collect()
        })
        .x_axis_formatter(move |mark, _range| {
            let j = mark.value.round();
            if (mark.value - j).abs() > 1e-6 || j < 0.0 {
                return String::new();
            }
            labels.get(j as usize).cloned().unwrap_or_default()
        })
}

/// Seconds over which the live rate plot counts tokens.
const RATE_WINDOW_S: f64 = 0.5;

fn plots_ui(ui: &mut egui::Ui, target: &PaneView, mentored: &PaneView, plot_h: f32) -> Vec<egui::Rect> {
    let progress = |p: &PaneView| -> Vec<[f64; 2]> {
        std::iter::once([0.0, 0.0]).chain(p.token_times.iter().enumerate().map(|(i, &t)| [t, (i + 1) as f64])).collect()
    };
    ui.horizontal(|ui| {
        ui.label(RichText::new("— target only").color(TARGET_COLOR).strong());
        ui.label(RichText::new("— mentored").color(MENTORED_COLOR).strong());
    });
    let mut rects = Vec::new();
    // The wheel scrolls the page, not the plots: over a plot it panned the live data out of view.
    ui.columns(3, |cols| {
        cols[0].label("Tokens generated vs seconds");
        let r = Plot::new("progress").height(plot_h).allow_scroll(false).x_axis_label("s").show(&mut cols[0], |p| {
            p.line(Line::new("target only", PlotPoints::new(progress(target))).color(TARGET_COLOR));
            p.line(Line::new("mentored", PlotPoints::new(progress(mentored))).color(MENTORED_COLOR));
        });
        rects.push(r.response.rect);
        cols[1].label(format!("Tokens / s (last {RATE_WINDOW_S} s)"));
        let r = Plot::new("rate").height(plot_h).allow_scroll(false).x_axis_label("s").show(&mut cols[1], |p| {
            let rate = |v: &PaneView| PlotPoints::new(v.rolling_tok_s(RATE_WINDOW_S));
            p.line(Line::new("target only", rate(target)).color(TARGET_COLOR));
            p.line(Line::new("mentored", rate(mentored)).color(MENTORED_COLOR));
        });
        rects.push(r.response.rect);
        cols[2].label("Accepted / drafted per round (mentored)");
        let r = Plot::new("acceptance")
            .height(plot_h)
            .allow_scroll(false)
            .x_axis_label("round")
            .include_y(0.0)
            .include_y(1.0)
            .show(&mut cols[2], |p| {
                let bars: Vec<Bar> = mentored
                    .rounds
                    .iter()
                    .filter(|(r, _)| r.n_proposed > 0)
                    .map(|(r, _)| Bar::new(r.index as f64, r.n_accepted as f64 / r.n_proposed as f64).width(0.8))
                    .collect();
                p.bar_chart(BarChart::new("acceptance", bars).color(MENTORED_COLOR));
            });
        rects.push(r.response.rect);
    });
    rects
}
