//! "Copy from a folder…": the chosen folder goes to the engine and into the settings, what the
//! engine read of it shows beside the button, and × stops.

use super::*;

#[test]
fn a_chosen_folder_is_read_shown_and_dropped() {
    let folder = PathBuf::from("/home/me/project");
    let settings = Settings { adaptive: true, lookup: true, ..Settings::default() };
    let (app, rig) = app_with(settings, ScriptedDialogs { folder: Some(folder.clone()), ..no_dialogs() });
    let mut h = harness(app);
    h.run_steps(2);
    rig.commands();
    h.get_by_label("+ a folder…").click();
    h.run_steps(2);
    let sent: Vec<_> = rig.commands().into_iter().filter(|c| matches!(c, EngineCommand::ReadCorpus(_))).collect();
    assert!(matches!(&sent[..], [EngineCommand::ReadCorpus(p)] if *p == vec![folder.clone()]), "{sent:?}");
    assert_eq!(h.state().settings.copy_from, vec![folder.clone()]);
    rig.send(EngineEvent::CorpusRead(Ok(Some("3 files, 0.1 MB, 20000 tokens".into()))));
    h.run_steps(2);
    h.get_by_label("3 files");
    // An error says why on the message line, and the choice stays until × is pressed.
    rig.send(EngineEvent::CorpusRead(Err("no text file to copy from in /home/me/project".into())));
    h.run_steps(2);
    h.get_by_label("folder not read");
    assert_eq!(h.state().view.error.as_deref(), Some("no text file to copy from in /home/me/project"));
    h.get_by_label("×").click();
    h.run_steps(2);
    let sent: Vec<_> = rig.commands().into_iter().filter(|c| matches!(c, EngineCommand::ReadCorpus(_))).collect();
    assert!(matches!(&sent[..], [EngineCommand::ReadCorpus(p)] if p.is_empty()), "{sent:?}");
    assert!(h.state().settings.copy_from.is_empty());
    rig.send(EngineEvent::CorpusRead(Ok(None)));
    h.run_steps(2);
    h.get_by_label("+ a folder…");
}

/// A folder chosen before is read again when the app starts (the engine reads it with the target
/// it loads).
#[test]
fn a_folder_in_the_settings_is_read_at_start() {
    let folder = PathBuf::from("/home/me/notes");
    let settings = Settings { copy_from: vec![folder.clone()], ..Settings::default() };
    let (_app, rig) = app_with(settings, no_dialogs());
    let sent = rig.commands();
    assert!(sent.iter().any(|c| matches!(c, EngineCommand::ReadCorpus(p) if *p == vec![folder.clone()])), "{sent:?}");
}
