//! Exit codes, decided once: every command returns an [`Exit`] or a
//! [`Failure`], and `main` maps it to the process exit code.

use aqw_core::ops::OpsError;

/// The process exit code of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// The command worked and found something that needs a person (open
    /// poison records, a replayed key not done in time).
    NeedsAPerson = 1,
    /// Usage or configuration error; nothing was touched.
    Usage = 2,
    /// Storage or runtime error.
    Runtime = 3,
}

impl Exit {
    /// [`Exit::NeedsAPerson`] when `needs` holds, else [`Exit::Ok`].
    pub fn needs_a_person_if(needs: bool) -> Self {
        if needs {
            Exit::NeedsAPerson
        } else {
            Exit::Ok
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e as u8)
    }
}

/// A failure with its exit code.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    pub fn usage(m: impl Into<String>) -> Self {
        Failure {
            exit: Exit::Usage,
            message: m.into(),
        }
    }

    pub fn runtime(m: impl Into<String>) -> Self {
        Failure {
            exit: Exit::Runtime,
            message: m.into(),
        }
    }
}

impl From<OpsError> for Failure {
    fn from(e: OpsError) -> Self {
        match e {
            OpsError::Usage(m) => Failure::usage(m),
            OpsError::Key(e) => Failure::usage(e.to_string()),
            OpsError::Storage(e) => Failure::runtime(format!("storage: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_the_documented_numbers() {
        let codes = [Exit::Ok, Exit::NeedsAPerson, Exit::Usage, Exit::Runtime].map(|e| e as u8);
        assert_eq!(codes, [0, 1, 2, 3]);
    }
}
