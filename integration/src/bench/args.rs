//! The command line the bench binaries share (clap): how many times each figure is
//! measured, the quick mode, and lists given comma-separated (`--sizes 10,100,500`).
//! Each binary's own flags are a `#[derive(clap::Parser)]` struct that flattens these.

use std::fmt::Display;
use std::ops::Deref;
use std::str::FromStr;

use clap::Args;

/// How many times each figure is measured; `N` is the binary's default.
#[derive(Args, Debug, Clone, Copy)]
pub struct Iterations<const N: usize> {
    /// Samples per figure (at least 1).
    #[arg(long, value_name = "N", default_value_t = N, value_parser = at_least_one)]
    pub iterations: usize,
}

/// A shorter run with smaller sizes (each bench says which).
#[derive(Args, Debug, Clone, Copy)]
pub struct Quick {
    /// Smaller sizes, for a short run.
    #[arg(long)]
    pub quick: bool,
}

impl Quick {
    /// `given` if the flag was given, else `quick` in quick mode and `full` otherwise.
    pub fn or<T>(&self, given: Option<T>, full: T, quick: T) -> T {
        given.unwrap_or(if self.quick { quick } else { full })
    }
}

/// A comma-separated list on the command line (`--sizes 10,100,500`); blanks around
/// items and empty items are passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct List<T>(pub Vec<T>);

impl<T: FromStr> FromStr for List<T>
where
    T::Err: Display,
{
    type Err = String;

    fn from_str(s: &str) -> Result<List<T>, String> {
        s.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse().map_err(|e| format!("{v:?}: {e}")))
            .collect::<Result<_, _>>()
            .map(List)
    }
}

impl<T> Deref for List<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

/// A whole number of at least 1.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        iterations: Iterations<7>,
        #[command(flatten)]
        quick: Quick,
        #[arg(long, default_value = "1,8,32")]
        sizes: List<usize>,
        #[arg(long)]
        think: Option<List<f64>>,
    }

    fn think(c: Cli) -> List<f64> {
        c.quick.or(c.think, List(vec![5.0]), List(vec![0.5]))
    }

    #[test]
    fn test_defaults_lists_and_quick() {
        let c = Cli::try_parse_from(["b"]).unwrap();
        assert_eq!(c.iterations.iterations, 7);
        assert_eq!(*c.sizes, [1, 8, 32]);
        assert!(!c.quick.quick);
        assert_eq!(*think(c), [5.0]);

        let c =
            Cli::try_parse_from(["b", "--iterations", "3", "--sizes", "2, 4,", "--quick"]).unwrap();
        assert_eq!(c.iterations.iterations, 3);
        assert_eq!(*c.sizes, [2, 4]);
        assert_eq!(*think(c), [0.5]);

        let c = Cli::try_parse_from(["b", "--quick", "--think", "1,2"]).unwrap();
        assert_eq!(*think(c), [1.0, 2.0]);
    }

    #[test]
    fn test_bad_values_are_refused() {
        assert!(Cli::try_parse_from(["b", "--iterations", "0"]).is_err());
        assert!(Cli::try_parse_from(["b", "--sizes", "1,x"]).is_err());
        assert!(Cli::try_parse_from(["b", "--unknown", "1"]).is_err());
    }
}
