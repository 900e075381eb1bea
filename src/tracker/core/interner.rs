//! Topic names as small numbers, so that each tracked delivery stores 4 bytes instead of a
//! string. A tracker sees a handful of topics, so names are never forgotten.

use std::collections::HashMap;

/// Maps topic names to dense `u32` ids and back.
#[derive(Debug, Default)]
pub struct Interner {
    names: Vec<Box<str>>,
    ids: HashMap<Box<str>, u32>,
}

impl Interner {
    /// The id of `name`, assigning the next one if it is new.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        // More than 4 billion distinct topics cannot exist in one Kafka cluster.
        let id = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), id);
        id
    }

    /// The id of `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// The name behind `id`, if this interner gave it out.
    pub fn get_name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(|n| &**n)
    }

    /// The name behind an id this interner gave out.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", |n| n)
    }
}
