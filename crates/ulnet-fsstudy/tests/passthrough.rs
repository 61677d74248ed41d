//! The pass-through passes data, metadata and errors through unchanged, and records what
//! it served. Needs /dev/fuse and root; each test says so and passes without them.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use ulnet_fsstudy::format::{OpKind, Record};
use ulnet_fsstudy::passthrough::{fuse_available, mount, MountOptions, Mounted};

struct Fixture {
    backing: tempfile::TempDir,
    mnt: tempfile::TempDir,
    trace: PathBuf,
    mounted: Option<Mounted>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// A pass-through of a fresh backing directory, or `None` (with the reason printed)
    /// where FUSE cannot be mounted.
    fn new() -> Option<Self> {
        if let Err(why) = fuse_available() {
            eprintln!("skipped: {why}");
            return None;
        }
        let (backing, mnt, dir) = (tempdir(), tempdir(), tempdir());
        let trace = dir.path().join("t.fstrace");
        let mounted = mount(backing.path(), mnt.path(), &trace, &MountOptions::default()).expect("mounts");
        Some(Fixture { backing, mnt, trace, mounted: Some(mounted), _dir: dir })
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mnt.path().join(rel)
    }

    fn b(&self, rel: &str) -> PathBuf {
        self.backing.path().join(rel)
    }

    /// Unmounts and returns the trace's records.
    fn finish(&mut self) -> Vec<Record> {
        let summary = self.mounted.take().expect("mounted").finish().expect("finishes");
        assert!(!summary.detached_busy);
        assert_eq!(summary.written.dropped, 0, "nothing dropped");
        let file = ulnet_fsstudy::reader::read_path(&self.trace).expect("reads");
        assert!(file.is_whole(), "{:?}", file.damage);
        file.records
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = m.finish();
        }
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn data_written_and_read_through_the_mount_is_the_backing_files_data() {
    let Some(f) = Fixture::new() else { return };
    for (i, len) in [0usize, 1, 4095, 4096, 100_000, 3 << 20].into_iter().enumerate() {
        let data = pattern(len, i as u64);
        let name = format!("f{i}.bin");
        fs::write(f.m(&name), &data).expect("write through the mount");
        assert_eq!(fs::read(f.b(&name)).expect("backing read"), data, "backing holds what was written ({len} bytes)");
        assert_eq!(fs::read(f.m(&name)).expect("mount read"), data, "the mount reads it back ({len} bytes)");
    }
    // Writes and reads at offsets, and an append.
    let file = fs::OpenOptions::new().read(true).write(true).open(f.m("f4.bin")).expect("open");
    file.write_all_at(b"HELLO", 70_000).expect("pwrite");
    let mut buf = [0u8; 5];
    file.read_exact_at(&mut buf, 70_000).expect("pread");
    assert_eq!(&buf, b"HELLO");
    let mut appender = fs::OpenOptions::new().append(true).open(f.m("f1.bin")).expect("append");
    appender.write_all(b"tail").expect("append");
    drop(appender);
    let mut expected = pattern(1, 1);
    expected.extend_from_slice(b"tail");
    assert_eq!(fs::read(f.b("f1.bin")).expect("read"), expected);
    // Seek and read past the end.
    let mut r = fs::File::open(f.m("f2.bin")).expect("open");
    r.seek(SeekFrom::Start(4000)).expect("seek");
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).expect("read");
    assert_eq!(rest, pattern(4095, 2)[4000..]);
    // A file that grows and shrinks under an open reader (large reads come from a mapping
    // of the backing file, which follows the file's size).
    let reader = fs::File::open(f.m("f5.bin")).expect("open");
    let mut big = vec![0u8; 1 << 20];
    reader.read_exact_at(&mut big, 1 << 20).expect("a large read");
    assert_eq!(big, pattern(3 << 20, 5)[1 << 20..2 << 20]);
    fs::OpenOptions::new().append(true).open(f.b("f5.bin")).expect("open").write_all(&[9u8; 100_000]).expect("grow");
    let mut grown = vec![0u8; 100_000];
    reader.read_exact_at(&mut grown, 3 << 20).expect("read what was added");
    assert_eq!(grown, vec![9u8; 100_000]);
    fs::OpenOptions::new().write(true).open(f.b("f5.bin")).expect("open").set_len(2 << 20).expect("shrink");
    let n = reader.read_at(&mut big, (2 << 20) - 10).expect("read across the new end");
    assert_eq!(n, 10, "a read stops at the new end");
    fs::OpenOptions::new().write(true).open(f.b("f5.bin")).expect("open").set_len(3 << 20).expect("restore");
    fs::File::options()
        .write(true)
        .open(f.b("f5.bin"))
        .expect("open")
        .write_all_at(&pattern(3 << 20, 5)[2 << 20..], 2 << 20)
        .expect("restore");
    drop(reader);
    // Truncation by open and by set_len.
    fs::OpenOptions::new().write(true).truncate(true).open(f.m("f3.bin")).expect("truncating open");
    assert_eq!(fs::metadata(f.b("f3.bin")).expect("stat").len(), 0);
    fs::OpenOptions::new().write(true).open(f.m("f5.bin")).expect("open").set_len(10).expect("set_len");
    assert_eq!(fs::read(f.b("f5.bin")).expect("read"), pattern(3 << 20, 5)[..10]);
}

fn same_metadata(a: &Path, b: &Path) {
    let (ma, mb) = (fs::symlink_metadata(a).expect("stat mount"), fs::symlink_metadata(b).expect("stat backing"));
    let fields =
        |m: &fs::Metadata| (m.len(), m.mode(), m.nlink(), m.uid(), m.gid(), m.mtime(), m.mtime_nsec(), m.rdev());
    assert_eq!(fields(&ma), fields(&mb), "{} and {}", a.display(), b.display());
}

#[test]
fn metadata_passes_through_unchanged() {
    let Some(f) = Fixture::new() else { return };
    fs::create_dir(f.m("d")).expect("mkdir");
    fs::write(f.m("d/a.txt"), b"abc").expect("write");
    fs::set_permissions(f.m("d/a.txt"), fs::Permissions::from_mode(0o640)).expect("chmod");
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(1_000_000_000, 123_456_789);
    fs::File::options().write(true).open(f.m("d/a.txt")).expect("open").set_modified(when).expect("utimes");
    std::os::unix::fs::symlink("a.txt", f.m("d/link")).expect("symlink");
    fs::hard_link(f.m("d/a.txt"), f.m("d/hard")).expect("link");
    fs::rename(f.m("d/hard"), f.m("hard2")).expect("rename");
    std::os::unix::fs::chown(f.m("d/a.txt"), Some(1234), Some(5678)).expect("chown");
    for rel in ["d", "d/a.txt", "d/link", "hard2", ""] {
        same_metadata(&f.m(rel), &f.b(rel));
    }
    assert_eq!(fs::metadata(f.b("d/a.txt")).expect("stat").mtime(), 1_000_000_000);
    assert_eq!(fs::metadata(f.b("d/a.txt")).expect("stat").mode() & 0o7777, 0o640);
    assert_eq!(fs::read_link(f.m("d/link")).expect("readlink"), PathBuf::from("a.txt"));
    assert_eq!(fs::read(f.m("d/link")).expect("through the link"), b"abc");
    assert_eq!(fs::metadata(f.m("hard2")).expect("stat").ino(), fs::metadata(f.m("d/a.txt")).expect("stat").ino());
    let names = |p: &Path| -> BTreeSet<String> {
        fs::read_dir(p).expect("list").map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect()
    };
    assert_eq!(names(&f.m("d")), names(&f.b("d")));
    assert_eq!(names(&f.m("")), names(&f.b("")));
    // Many entries: the listing spans several readdir requests.
    for i in 0..500 {
        fs::write(f.m(&format!("d/many-{i:04}")), b"").expect("create");
    }
    assert_eq!(names(&f.m("d")), names(&f.b("d")));
    assert_eq!(names(&f.m("d")).len(), 502);
    rustix::fs::setxattr(f.m("d/a.txt").as_path(), "user.study", b"yes", rustix::fs::XattrFlags::empty())
        .expect("setxattr");
    let mut v = [0u8; 8];
    let n = rustix::fs::getxattr(f.b("d/a.txt").as_path(), "user.study", &mut v).expect("getxattr");
    assert_eq!(&v[..n], b"yes");
}

/// The errno of an operation through the mount and on the backing directory.
fn same_error(f: &Fixture, what: &str, op: impl Fn(&Path) -> std::io::Result<()>) {
    let (through, direct) = (op(f.mnt.path()), op(f.backing.path()));
    let code = |r: &std::io::Result<()>| r.as_ref().err().and_then(|e| e.raw_os_error());
    assert!(direct.is_err(), "{what}: fails on the backing directory");
    assert_eq!(code(&through), code(&direct), "{what}: the same error through the mount");
}

#[test]
fn errors_pass_through_unchanged() {
    let Some(f) = Fixture::new() else { return };
    fs::create_dir_all(f.m("full/sub")).expect("mkdir");
    fs::write(f.m("file"), b"x").expect("write");
    same_error(&f, "open a missing file", |d| fs::File::open(d.join("missing")).map(drop));
    same_error(&f, "mkdir an existing name", |d| fs::create_dir(d.join("full")));
    same_error(&f, "rmdir a non-empty directory", |d| fs::remove_dir(d.join("full")));
    same_error(&f, "unlink a directory", |d| fs::remove_file(d.join("full")));
    same_error(&f, "rename a directory into itself", |d| fs::rename(d.join("full"), d.join("full/sub/x")));
    same_error(&f, "a file as a directory", |d| fs::File::open(d.join("file/x")).map(drop));
    same_error(&f, "exclusive create of an existing file", |d| {
        fs::OpenOptions::new().write(true).create_new(true).open(d.join("file")).map(drop)
    });
    same_error(&f, "read a directory", |d| fs::read(d.join("full")).map(drop));
    same_error(&f, "readlink of a file", |d| fs::read_link(d.join("file")).map(drop));
}

#[test]
fn the_trace_records_every_operation_served() {
    let Some(mut f) = Fixture::new() else { return };
    fs::write(f.m("one.c"), pattern(10_000, 9)).expect("write");
    let mut r = fs::File::open(f.m("one.c")).expect("open");
    let mut chunk = vec![0u8; 4096];
    let mut total = 0;
    loop {
        let n = r.read(&mut chunk).expect("read");
        if n == 0 {
            break;
        }
        total += n;
    }
    drop(r);
    assert_eq!(total, 10_000);
    fs::rename(f.m("one.c"), f.m("two.c")).expect("rename");
    fs::remove_file(f.m("two.c")).expect("unlink");
    let _ = fs::metadata(f.m("nothing-here"));
    let records = f.finish();
    let ops: Vec<_> = records.iter().filter_map(|r| if let Record::Op(o) = r { Some(*o) } else { None }).collect();
    let of = |k: OpKind| ops.iter().filter(move |o| o.kind == k as u8);
    let create = of(OpKind::Create).next().expect("a create");
    assert_eq!(create.result, 1, "a new file");
    assert_eq!(of(OpKind::Write).map(|o| o.result).sum::<i64>(), 10_000);
    // Two serving threads record in the order they finish: order by start time.
    let mut reads: Vec<_> = of(OpKind::Read).collect();
    reads.sort_by_key(|o| o.start_ns);
    assert_eq!(reads.iter().map(|o| o.result).sum::<i64>(), 10_000);
    assert_eq!(reads.iter().map(|o| o.offset).collect::<Vec<_>>(), vec![0, 4096, 8192, 10_000], "the program's reads");
    assert!(reads.iter().all(|o| o.handle != 0 && o.file == create.file));
    assert_eq!(of(OpKind::Rename).next().expect("a rename").file, create.file);
    assert_eq!(of(OpKind::Unlink).next().expect("an unlink").other, create.file, "the removed file");
    assert!(of(OpKind::Lookup).any(|o| o.result == -libc::ENOENT as i64), "the failed lookup");
    assert_eq!(of(OpKind::Release).count(), 2, "one release per open");
    let named = records.iter().any(|r| matches!(r, Record::Name(n) if n.file == create.file && n.path == "one.c"));
    assert!(named, "the created file is named");
    assert!(
        records.iter().any(|r| matches!(r, Record::Process(p) if p.pid != 0 && !p.name.is_empty())),
        "processes named"
    );
}
