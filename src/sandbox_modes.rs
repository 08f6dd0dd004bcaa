//! The sandbox's chaos modes as a setting: which ways of misbehaving the simulator is asked for, by the
//! server's `sandbox.chaos` setting or by a record's metadata. It stands below both the configuration that
//! reads the setting and the simulator that plays the modes (`providers::chaos`, which says what each does).

use std::fmt;

use caisse_engine::domain::Metadata;

/// Metadata key a merchant sets on a payment or payout to choose its chaos modes, e.g. `"duplicate,late"`.
pub const METADATA_KEY: &str = "sandbox_chaos";

/// One way the simulator misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Duplicate,
    Late,
    Reorder,
    Flap,
    Lost,
}

impl Mode {
    /// The modes that distort notices, which `all` turns on.
    pub const ALL: [Mode; 4] = [Mode::Duplicate, Mode::Late, Mode::Reorder, Mode::Flap];
    /// Every mode, by name.
    pub const NAMED: [Mode; 5] = [Mode::Duplicate, Mode::Late, Mode::Reorder, Mode::Flap, Mode::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Duplicate => "duplicate",
            Mode::Late => "late",
            Mode::Reorder => "reorder",
            Mode::Flap => "flap",
            Mode::Lost => "lost",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of [`Mode`]s; the empty set is the well-behaved simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Chaos(u8);

impl Chaos {
    pub const OFF: Chaos = Chaos(0);
    pub const ALL: Chaos = Chaos(0b1111);

    pub fn only(mode: Mode) -> Chaos {
        Chaos(mode.bit())
    }

    pub fn has(self, mode: Mode) -> bool {
        self.0 & mode.bit() != 0
    }

    pub fn is_off(self) -> bool {
        self == Chaos::OFF
    }

    /// Parses `off` (or empty), `all`, or a comma list of mode names; the error says what is allowed.
    pub fn parse(text: &str) -> Result<Chaos, String> {
        let mut chaos = Chaos::OFF;
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "off" | "none" => {}
                "all" => chaos = Chaos::ALL,
                _ => match Mode::NAMED.into_iter().find(|m| m.as_str() == word) {
                    Some(mode) => chaos.0 |= mode.bit(),
                    None => {
                        return Err(format!("`{word}` is not one of off, all, duplicate, late, reorder, flap, lost"));
                    }
                },
            }
        }
        Ok(chaos)
    }

    /// The modes for one record: its metadata's [`METADATA_KEY`] when set and valid, else `self` (the server's).
    /// A value that does not parse is ignored with a warning rather than failing a payment the API accepted.
    pub fn for_metadata(self, metadata: &Metadata, transaction_id: &str) -> Chaos {
        match metadata.get(METADATA_KEY).map(Chaos::parse) {
            None => self,
            Some(Ok(chosen)) => chosen,
            Some(Err(why)) => {
                tracing::warn!(tx = %transaction_id, "metadata {METADATA_KEY} ignored: {why}");
                self
            }
        }
    }
}

impl fmt::Display for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_off() {
            return f.write_str("off");
        }
        let names: Vec<&str> = Mode::NAMED.into_iter().filter(|m| self.has(*m)).map(Mode::as_str).collect();
        f.write_str(&names.join(","))
    }
}
