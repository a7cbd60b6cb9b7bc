//! Python's `random.Random` (MT19937 seeded as CPython seeds it from an integer), so that a
//! seed gives the same draws as compilebench, which is a Python script: its random mode
//! (seed 555) shuffles the compile output once and then picks operations, trees and the
//! patch's unlinks with `choice`, `randint` and `shuffle`. Only the calls compilebench
//! makes are here; the test checks them against the Python interpreter itself.

const N: usize = 624;
const M: usize = 397;

/// A Mersenne Twister with CPython's integer seeding and `_randbelow`.
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyRandom(index {})", self.index)
    }
}

impl PyRandom {
    /// `random.Random(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        // CPython splits abs(seed) into 32-bit words, least significant first; 0 is [0].
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut r = Self {
            mt: [0; N],
            index: N,
        };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
                let mag = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `getrandbits(k)` for 1 <= k <= 32.
    fn getrandbits(&mut self, k: u32) -> u32 {
        self.next_u32() >> (32 - k)
    }

    /// `_randbelow(n)`: uniform in 0..n by rejection on n's bit length (n >= 1).
    pub fn below(&mut self, n: usize) -> usize {
        let n = n.max(1) as u64;
        let k = 64 - n.leading_zeros();
        debug_assert!(k <= 32, "compilebench's draws are all below 2^32");
        loop {
            let r = u64::from(self.getrandbits(k.min(32)));
            if r < n {
                return r as usize;
            }
        }
    }

    /// `randint(a, b)`, both ends included.
    pub fn randint(&mut self, a: usize, b: usize) -> usize {
        a + self.below(b - a + 1)
    }

    /// `shuffle(x)`.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.below(i + 1);
            x.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The same calls in CPython; None when no python3 is installed (the suite's setup
    /// installs it, so CI always compares).
    fn python(code: &str) -> Option<String> {
        let out = Command::new("python3").arg("-c").arg(code).output().ok()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    #[test]
    fn draws_match_cpython() {
        for seed in [555u64, 0, 1, 1 << 40] {
            let Some(expected) = python(&format!(
                "import random\n\
                 r = random.Random({seed})\n\
                 x = list(range(50)); r.shuffle(x)\n\
                 out = x + [r.choice(range(7)) for _ in range(40)]\n\
                 out += [r.randint(100, 100000) for _ in range(10)]\n\
                 out += [r.randint(0, 3) for _ in range(20)] + [r.choice(range(1)) for _ in range(3)]\n\
                 print(' '.join(map(str, out)))"
            )) else {
                eprintln!("python3 not found: skipped");
                return;
            };
            let mut r = PyRandom::new(seed);
            let mut x: Vec<usize> = (0..50).collect();
            r.shuffle(&mut x);
            let mut out = x;
            out.extend((0..40).map(|_| r.below(7)));
            out.extend((0..10).map(|_| r.randint(100, 100_000)));
            out.extend((0..20).map(|_| r.randint(0, 3)));
            out.extend((0..3).map(|_| r.below(1)));
            let ours: Vec<String> = out.iter().map(usize::to_string).collect();
            assert_eq!(ours.join(" "), expected, "seed {seed}");
        }
    }
}
