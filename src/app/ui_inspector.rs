//! The token inspector: for the pinned token, p, q and π at its position (the most likely tokens
//! as grouped bars and as a table), the numbers behind its acceptance, and its round.

use super::engine_thread::Pane;
use super::ui_panes::source_name;
use super::view::PaneView;
use super::MentorApp;
use crate::generate::{TokenInfo, TopEntry};
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart};

const P_COLOR: Color32 = Color32::from_rgb(70, 130, 230);
const Q_COLOR: Color32 = Color32::from_rgb(46, 160, 67);
const PI_COLOR: Color32 = Color32::from_rgb(230, 120, 40);

pub fn inspector_ui(app: &MentorApp, ui: &mut egui::Ui) {
    let Some((pane, view, t)) = app.view.pinned_token() else {
        ui.weak("Click any token in either pane to pin it here: p, q and π at its position, and its round.");
        return;
    };
    ui.columns(2, |cols| {
        egui::ScrollArea::vertical().id_salt("inspector facts").show(&mut cols[0], |ui| facts_ui(ui, pane, view, t));
        bars_ui(&mut cols[1], t);
    });
}

/// A token's text as it reads in a label (whitespace made visible).
fn shown(text: &str) -> String {
    format!("{text:?}")
}

fn facts_ui(ui: &mut egui::Ui, pane: Pane, view: &PaneView, t: &TokenInfo) {
    let pane_name = match pane {
        Pane::Target => "target only",
        Pane::Mentored => "mentored",
    };
    ui.strong(format!("{} at output position {} ({pane_name})", shown(&t.text), t.pos));
    ui.label(source_name(t.source));
    let mut num = |name: &str, v: Option<f64>| {
        if let Some(v) = v {
            ui.horizontal(|ui| {
                ui.label(name);
                ui.label(RichText::new(format!("{v:.4}")).monospace());
            });
        }
    };
    num("p(x), the target:", t.p_target.map(f64::from));
    num("q(x), the draft:", t.q_draft.map(f64::from));
    num("π(x), the mixture:", t.pi_mixed.map(f64::from));
    num("d = TV(p, q):", t.tv);
    num("θ:", t.theta);
    num("acceptance probability min(1, π/q):", t.accept_prob);
    num("surprise -log p(x) at T = 1:", t.nll);
    for (name, v) in &t.rule_notes {
        num(&format!("{name}:"), Some(*v));
    }
    if let Some(x) = t.drafted {
        let name =
            |x: u32| t.top.iter().find(|e| e.id == x).map(|e| shown(&e.text)).unwrap_or_else(|| format!("id {x}"));
        let verdict = match (x == t.id, t.offers.contains(&t.id)) {
            (true, _) => "accepted",
            (false, true) => "not the target's token, but a runner-up verified beside it was: accepted",
            (false, false) => "rejected; the verifier emitted this token instead",
        };
        ui.label(format!("The draft proposed {}: {verdict}.", name(x)));
        if !t.offers.is_empty() {
            let names: Vec<String> = t.offers.iter().map(|&o| name(o)).collect();
            ui.label(format!("Also verified here, the draft's runners-up: {}.", names.join(", ")));
        }
        if t.accept_prob.is_none() {
            ui.weak(
                "Same-seed coupling: accepted exactly when the draw from π with this position's noise is the proposal.",
            );
        }
    }
    if let Some(r) = t.round {
        round_ui(ui, view, r);
    }
    ui.add_space(4.0);
    top_table_ui(ui, t);
}

/// The pinned token's round: what was drafted and what became of it.
fn round_ui(ui: &mut egui::Ui, view: &PaneView, r: usize) {
    if let Some((info, _)) = view.rounds.iter().find(|(info, _)| info.index == r) {
        ui.label(format!(
            "Round {r}: {} proposed ({} copied), {} accepted, {} emitted.",
            info.n_proposed, info.n_copied, info.n_accepted, info.n_emitted
        ));
    }
    let tokens: Vec<&TokenInfo> = view.tokens.iter().filter(|tok| tok.round == Some(r)).collect();
    if tokens.iter().any(|tok| !candidates(tok).is_empty()) {
        ui.weak("At each depth: the token the walk emitted, then the other candidates the target verified there.");
    }
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 6.0;
        for tok in tokens {
            ui.vertical(|ui| {
                let dark = ui.visuals().dark_mode;
                let mut text = RichText::new(shown(&tok.text)).monospace();
                if let Some(c) = super::ui_panes::source_color(tok.source, dark) {
                    text = text.background_color(c);
                }
                ui.label(text).on_hover_text(source_name(tok.source));
                for (x, why) in candidates(tok) {
                    let name = tok.top.iter().find(|e| e.id == x).map(|e| shown(&e.text)).unwrap_or(format!("id {x}"));
                    ui.weak(RichText::new(format!("{why} {name}")).monospace().small());
                }
            });
        }
    });
}

/// The candidates verified at a token's position besides the emitted one: the drafted token
/// ("rejected", or "not taken" where the walk took one of its runners-up instead), and the draft's
/// runners-up verified beside it ("also").
fn candidates(t: &TokenInfo) -> Vec<(u32, &'static str)> {
    let why = if t.offers.contains(&t.id) { "not taken" } else { "rejected" };
    let mut out: Vec<(u32, &'static str)> = t.drafted.filter(|&x| x != t.id).map(|x| (x, why)).into_iter().collect();
    out.extend(t.offers.iter().filter(|&&o| o != t.id && Some(o) != t.drafted).map(|&o| (o, "also")));
    out
}

fn top_table_ui(ui: &mut egui::Ui, t: &TokenInfo) {
    if t.top.is_empty() {
        return;
    }
    const WIDTHS: [f32; 4] = [110.0, 62.0, 62.0, 62.0];
    super::table_row(ui, &WIDTHS, false, |i, ui| {
        ui.strong(["token", "p", "q", "π"][i]);
    });
    let cell = |v: Option<f32>| RichText::new(v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into())).monospace();
    for (row, e) in t.top.iter().enumerate() {
        super::table_row(ui, &WIDTHS, row % 2 == 0, |i, ui| {
            let text = match i {
                0 => {
                    let label = RichText::new(shown(&e.text));
                    if e.id == t.id {
                        label.strong()
                    } else {
                        label
                    }
                }
                1 => cell(e.p_target),
                2 => cell(e.q_draft),
                _ => cell(e.pi_mixed),
            };
            ui.add(egui::Label::new(text).truncate());
        });
    }
}

/// p, q and π of the most likely tokens as grouped bars; the emitted token's label is marked.
fn bars_ui(ui: &mut egui::Ui, t: &TokenInfo) {
    ui.horizontal(|ui| {
        ui.label(RichText::new("p (target)").color(P_COLOR));
        ui.label(RichText::new("q (draft)").color(Q_COLOR));
        ui.label(RichText::new("π (followed)").color(PI_COLOR));
        ui.weak("» marks the emitted token");
    });
    let labels: Vec<String> = t
        .top
        .iter()
        .map(|e| {
            let text: String = e.text.chars().take(10).collect();
            if e.id == t.id {
                format!("»{text}")
            } else {
                text
            }
        })
        .collect();
    let series = |name: &str, offset: f64, color: Color32, get: fn(&TopEntry) -> Option<f32>| {
        let bars: Vec<Bar> = t
            .top
            .iter()
            .enumerate()
            .filter_map(|(j, e)| get(e).map(|v| Bar::new(j as f64 + offset, f64::from(v)).width(0.26)))
            .collect();
        BarChart::new(name, bars).color(color)
    };
    super::ui_panes::category_plot("inspector bars", labels).show(ui, |p| {
        p.bar_chart(series("p", -0.28, P_COLOR, |e| e.p_target));
        p.bar_chart(series("q", 0.0, Q_COLOR, |e| e.q_draft));
        p.bar_chart(series("π", 0.28, PI_COLOR, |e| e.pi_mixed));
    });
}
