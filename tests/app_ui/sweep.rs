//! Sweeps: the grid the app sends and the frontier it plots; every rule's values.

use super::*;

#[test]
fn sweep_sends_the_grid_and_plots_the_frontier() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.state_mut().settings.sweep_budgets = "0, 0.5, 1".into();
    h.state_mut().settings.sweep_lens = "4, auto".into();
    h.get_by_role_and_label(Role::Button, "Sweep").click();
    h.run_steps(2);
    let cmds = rig.commands();
    let Some(EngineCommand::Sweep { run_id, grid, draftings, seeds, .. }) = cmds.into_iter().next() else {
        panic!("no sweep sent")
    };
    let tv = mentor_lab::MentorRule::Tv;
    assert_eq!(grid, vec![(tv, 0.0), (tv, 0.5), (tv, 1.0)]);
    assert_eq!(draftings, vec![mentor_lab::Drafting::Chain(4), mentor_lab::Drafting::adaptive()]);
    assert_eq!(seeds, vec![42, 43, 44], "three seeds from the settings' seed");
    assert_eq!(h.state().view.sweep.total, 3 * 7);
    // Two seeds of target-only and of one point: speedups paired by seed (2.0 and 1.0).
    for (seed, target_e2e, e2e, nll) in [(42, 2.0, 1.0, 2.5), (43, 3.0, 3.0, 2.1)] {
        let point = |label: &str, budget, k, e2e, nll| EngineEvent::SweepPoint {
            run_id,
            label: label.into(),
            rule: mentor_lab::MentorRule::Tv,
            budget,
            draft_len: DraftLen::Fixed(k),
            seed,
            stats: stats(e2e, nll),
        };
        rig.send(point("target", 0.0, 1, target_e2e, 1.5));
        rig.send(point("fixed=4,tv=1", 1.0, 4, e2e, nll));
    }
    rig.send(EngineEvent::SweepProgress { run_id, done: 4, total: 21 });
    h.run_steps(2);
    let f = h.state().view.sweep.frontier();
    assert_eq!(f.len(), 2);
    assert_eq!((f[1].label.as_str(), f[1].n_seeds), ("fixed=4,tv=1", 2));
    assert_eq!(f[1].speedup, [1.0, 1.5, 2.0]);
    assert_eq!(f[1].nll, [2.1, 2.3, 2.5]);
    assert_eq!(f[0].speedup, [1.0, 1.0, 1.0]);
    assert_eq!((f[0].rule, f[1].rule), (None, Some(tv)), "target-only is no rule's point");
    h.get_by_label("4/21");
    // Every sweep run is in the runs table, with its seed and paired speedup.
    let sweep_rows: Vec<_> = h.state().history.iter().filter(|r| r.config.starts_with("sweep: ")).cloned().collect();
    assert_eq!(sweep_rows.len(), 4);
    assert_eq!(
        (sweep_rows[1].config.as_str(), sweep_rows[1].seed, sweep_rows[1].speedup),
        ("sweep: fixed=4,tv=1", 42, 2.0)
    );
    // A bad grid is an error message, not a command.
    rig.send(EngineEvent::Done { run_id });
    h.run_steps(2);
    h.state_mut().settings.sweep_budgets = "0, lots".into();
    h.get_by_role_and_label(Role::Button, "Sweep").click();
    h.run_steps(2);
    assert!(rig.commands().is_empty());
    h.get_by_label_contains("sweep budget `lots`");
}

/// "every rule" sweeps each rule over five values across its range, whatever the budgets typed.
#[test]
fn a_sweep_over_every_rule_sends_each_rules_values() {
    let (app, rig) = app_with(Settings::default(), no_dialogs());
    let mut h = harness(app);
    h.state_mut().settings.sweep_lens = "8".into();
    h.get_by_label("every rule, five values each").click();
    h.run_steps(1);
    h.get_by_role_and_label(Role::Button, "Sweep").click();
    h.run_steps(2);
    let Some(EngineCommand::Sweep { grid, .. }) = rig.commands().into_iter().next() else { panic!("no sweep sent") };
    assert_eq!(grid.len(), 5 * mentor_lab::MentorRule::ALL.len());
    for rule in mentor_lab::MentorRule::ALL {
        let values: Vec<f64> = grid.iter().filter(|(r, _)| *r == rule).map(|&(_, v)| v).collect();
        assert_eq!(values, rule.param().frontier_values(5), "{rule}");
        assert!(values.iter().all(|&v| rule.param().check(v).is_ok()));
    }
    assert_eq!(h.state().view.sweep.total, 3 * (1 + 30));
}
