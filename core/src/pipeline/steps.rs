//! The steps a connection takes next, as the pipeline's calls hand them
//! to the driver.

use super::Step;

/// Steps, in order: the first kept in place, the others in a list. Most
/// calls make one (Settle, a Send): no allocation for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps<T> {
    first: Option<Step<T>>,
    rest: Vec<Step<T>>,
}

impl<T> Default for Steps<T> {
    fn default() -> Self {
        Steps {
            first: None,
            rest: Vec::new(),
        }
    }
}

impl<T> Steps<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn one(step: Step<T>) -> Self {
        Steps {
            first: Some(step),
            rest: Vec::new(),
        }
    }

    pub fn push(&mut self, step: Step<T>) {
        if self.first.is_none() {
            self.first = Some(step);
        } else {
            self.rest.push(step);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Step<T>> {
        self.first.iter().chain(&self.rest)
    }
}

impl<T> Extend<Step<T>> for Steps<T> {
    fn extend<I: IntoIterator<Item = Step<T>>>(&mut self, steps: I) {
        for step in steps {
            self.push(step);
        }
    }
}

impl<T> FromIterator<Step<T>> for Steps<T> {
    fn from_iter<I: IntoIterator<Item = Step<T>>>(steps: I) -> Self {
        let mut all = Steps::new();
        all.extend(steps);
        all
    }
}

impl<T> IntoIterator for Steps<T> {
    type Item = Step<T>;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Step<T>>, std::vec::IntoIter<Step<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

impl<T: PartialEq> PartialEq<Vec<Step<T>>> for Steps<T> {
    fn eq(&self, other: &Vec<Step<T>>) -> bool {
        self.iter().eq(other)
    }
}
