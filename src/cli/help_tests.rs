//! The help, checked: every argument and command teaches itself, every
//! example in `--help` and in the on-call guide parses.

#[cfg(test)]
use super::args::Cli;
use clap::{CommandFactory, Parser};

/// Walks clap's command tree: every argument, value and subcommand has a
/// one-line help, and every leaf command ends with an example.
#[test]
fn help_teaches_every_argument_and_command() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none() {
                missing.push(format!("{path} --{id}: no help"));
            }
            // Flags' true/false and clap_complete's shell names need none.
            let own_values = a.get_action().takes_values() && id != "shell";
            for v in a.get_possible_values().into_iter().filter(|_| own_values) {
                if v.get_help().is_none() {
                    missing.push(format!("{path} --{id} {}: no help", v.get_name()));
                }
            }
        }
        for sc in cmd.get_subcommands() {
            let name = format!("{path} {}", sc.get_name());
            if sc.get_about().is_none() {
                missing.push(format!("{name}: no about"));
            }
            let is_leaf = sc.get_subcommands().next().is_none();
            let has_example = sc
                .get_after_help()
                .is_some_and(|h| h.to_string().contains("Example"));
            if is_leaf && !has_example {
                missing.push(format!("{name}: no example"));
            }
            walk(sc, &name, missing);
        }
    }
    let cmd = Cli::command();
    cmd.clone().debug_assert();
    let mut missing = Vec::new();
    walk(&cmd, "aqw", &mut missing);
    assert!(missing.is_empty(), "{missing:#?}");
    let top = cmd.get_after_help().unwrap().to_string();
    for code in ["0 ", "1 ", "2 ", "3 "] {
        assert!(
            top.contains(&format!("  {code}")),
            "exit code {code} in: {top}"
        );
    }
}

/// Every example line of every command's help, as clap parses it: a
/// help example that no longer parses is a broken procedure.
#[test]
fn every_help_example_parses() {
    fn examples(cmd: &clap::Command, out: &mut Vec<String>) {
        if let Some(h) = cmd.get_after_help() {
            let h = h.to_string();
            let from = h.find("Example").map_or(h.len(), |i| i);
            out.extend(
                h[from..]
                    .lines()
                    .filter(|l| l.starts_with("  "))
                    .map(str::to_string),
            );
        }
        cmd.get_subcommands().for_each(|sc| examples(sc, out));
    }
    // The examples rely on --by defaulting to $USER, as in a login shell.
    if std::env::var_os("USER").is_none() {
        std::env::set_var("USER", "operator");
    }
    let mut lines = Vec::new();
    examples(&Cli::command(), &mut lines);
    let mut parsed = 0;
    for line in &lines {
        for argv in aqw_invocations(line) {
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("help example does not parse: {line}\n{argv:?}\n{e}");
            }
            parsed += 1;
        }
    }
    let leaves = 16;
    assert!(
        parsed >= leaves,
        "only {parsed} aqw invocations in {lines:#?}"
    );
}

/// Issue 39: the procedure the alert links (docs/oncall.md) can be
/// followed as written: every `aqw` command it shows, in a code block
/// or inline, parses, its placeholders (QUEUE, ID, KEY, …) filled in
/// and `[optional]` flags given.
#[test]
fn every_command_in_the_oncall_guide_parses() {
    let doc = include_str!("../../docs/oncall.md");
    let (mut lines, mut prose, mut in_block) = (Vec::new(), String::new(), false);
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if in_block {
            lines.push(line.trim().to_string());
        } else {
            prose.push_str(line.trim());
            prose.push(' ');
        }
    }
    lines.extend(prose.split('`').skip(1).step_by(2).map(str::to_string));
    if std::env::var_os("USER").is_none() {
        std::env::set_var("USER", "operator");
    }
    let fill = |w: &str| match w.trim_start_matches('[').trim_end_matches(']') {
        "QUEUE" => "receipts".to_string(),
        "FUNCTION" => "SendReceipt".into(),
        "KEY" => "receipt:o-1".into(),
        "T" => "06:00:00".into(),
        other => other.to_string(),
    };
    // Prose names a command (`aqw poison list` prints …): its path
    // must exist; anything with arguments must parse.
    let names_a_command = |argv: &[String]| {
        let mut cmd = Cli::command();
        argv[1..].iter().all(|w| match cmd.find_subcommand(w) {
            Some(sub) => {
                cmd = sub.clone();
                true
            }
            None => false,
        })
    };
    let mut parsed = 0;
    for line in &lines {
        for argv in aqw_invocations(line) {
            if argv.len() > 1 && names_a_command(&argv) {
                continue;
            }
            let argv: Vec<String> = argv.iter().map(|w| fill(w)).collect();
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("docs/oncall.md: a command does not parse: {line}\n{argv:?}\n{e}");
            }
            parsed += 1;
        }
    }
    assert!(parsed >= 30, "only {parsed} aqw commands in docs/oncall.md");
}

/// The `aqw` commands of one shell line: words split as a POSIX shell
/// would for these examples (quotes, `$(…)` as one word, pipes,
/// redirections, leading `NAME=value` assignments dropped).
fn aqw_invocations(line: &str) -> Vec<Vec<String>> {
    let (mut words, mut word, mut quote, mut depth) = (vec![], String::new(), None, 0);
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => word.extend(chars.next()),
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => quote = Some(c),
            (None, '$') if chars.peek() == Some(&'(') => {
                depth += 1;
                word.push(c);
            }
            (None, ')') if depth > 0 => {
                depth -= 1;
                word.push(c);
            }
            (None, ' ') if depth == 0 => {
                words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)))
            }
            (None, c) => word.push(c),
        }
    }
    words.extend((!word.is_empty()).then_some(word));
    let mut out = Vec::new();
    for segment in words.split(|w| w == "|") {
        let mut argv: Vec<String> = Vec::new();
        let mut it = segment
            .iter()
            .skip_while(|w| w.contains('=') && !w.starts_with('-'));
        while let Some(w) = it.next() {
            if w == ">" {
                it.next();
            } else {
                argv.push(w.clone());
            }
        }
        if argv.first().is_some_and(|w| w == "aqw") {
            out.push(argv);
        }
    }
    out
}

#[test]
fn by_behaves_the_same_on_replay_and_discard() {
    let by_of = |sub: &str| {
        let cmd = Cli::command();
        let poison = cmd.find_subcommand("poison").unwrap();
        let arg = poison
            .find_subcommand(sub)
            .unwrap()
            .get_arguments()
            .find(|a| a.get_id() == "by")
            .unwrap()
            .clone();
        (
            arg.get_env().map(|e| e.to_os_string()),
            arg.get_default_values().to_vec(),
        )
    };
    assert_eq!(by_of("replay"), by_of("discard"));
}
