package io.kdq.spark.fs;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.FileNotFoundException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The process-free local file system behaves as Hadoop's where Delta and Structured Streaming rely on it. */
class NioLocalFileSystemTest {
  @TempDir java.nio.file.Path dir;

  private static Configuration conf() {
    Configuration conf = new Configuration(false);
    conf.set("fs.file.impl", NioLocalFileSystem.class.getName());
    conf.set("fs.AbstractFileSystem.file.impl", NioLocalFileSystem.Fs.class.getName());
    conf.setBoolean("fs.file.impl.disable.cache", true);
    return conf;
  }

  @Test
  void createsFilesWithTheRequestedPermissionsAndChecksums() throws Exception {
    FileSystem fs = FileSystem.get(dir.toUri(), conf());
    assertEquals(NioLocalFileSystem.class, fs.getClass());
    Path file = new Path(dir.toUri().toString(), "data.bin");
    try (FSDataOutputStream out = fs.create(file, new FsPermission((short) 0640), false, 4096, (short) 1, 1 << 20, null)) {
      out.write("hello".getBytes(StandardCharsets.UTF_8));
    }
    assertEquals("rw-r-----", PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("data.bin"))));
    assertTrue(Files.exists(dir.resolve(".data.bin.crc")), "the checksum file, as Hadoop's LocalFileSystem writes it");
    fs.setPermission(file, new FsPermission((short) 0755));
    assertEquals("rwxr-xr-x", PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("data.bin"))));
    try (FSDataInputStream in = fs.open(file)) {
      byte[] read = new byte[5];
      in.readFully(read);
      assertArrayEquals("hello".getBytes(StandardCharsets.UTF_8), read);
    }
  }

  @Test
  void fileContextRenameIsAtomicNoOverwriteAsDeltaNeedsIt() throws Exception {
    FileContext fc = FileContext.getFileContext(dir.toUri(), conf());
    Path tmp = new Path(dir.toUri().toString(), ".00001.json.tmp");
    Path target = new Path(dir.toUri().toString(), "00001.json");
    try (FSDataOutputStream out = fc.create(tmp, java.util.EnumSet.of(org.apache.hadoop.fs.CreateFlag.CREATE))) {
      out.write('{');
    }
    fc.rename(tmp, target, Options.Rename.NONE);
    assertTrue(Files.exists(dir.resolve("00001.json")));
    assertFalse(Files.exists(dir.resolve(".00001.json.tmp")));
    // A second writer of the same version must fail: Delta's mutual exclusion on the local file system.
    Path other = new Path(dir.toUri().toString(), ".00001.json.other");
    try (FSDataOutputStream out = fc.create(other, java.util.EnumSet.of(org.apache.hadoop.fs.CreateFlag.CREATE))) {
      out.write('[');
    }
    assertThrows(FileAlreadyExistsException.class, () -> fc.rename(other, target, Options.Rename.NONE));
    assertEquals("{", Files.readString(dir.resolve("00001.json")));
  }

  @Test
  void linkStatusOfPlainFilesMissingPathsAndSymbolicLinks() throws Exception {
    NioLocalFileSystem.Raw raw = new NioLocalFileSystem.Raw();
    raw.initialize(dir.toUri(), conf());
    Files.writeString(dir.resolve("plain"), "x");
    Path plain = new Path(dir.toUri().toString(), "plain");
    assertTrue(raw.getFileLinkStatus(plain).isFile());
    assertFalse(raw.getFileLinkStatus(plain).isSymlink());
    assertThrows(FileNotFoundException.class, () -> raw.getFileLinkStatus(new Path(dir.toUri().toString(), "missing")));
    // A symbolic link takes Hadoop's own path: the same answer as Hadoop's RawLocalFileSystem.
    Files.createSymbolicLink(dir.resolve("link"), dir.resolve("plain"));
    Path link = new Path(dir.toUri().toString(), "link");
    org.apache.hadoop.fs.RawLocalFileSystem hadoops = new org.apache.hadoop.fs.RawLocalFileSystem();
    hadoops.initialize(dir.toUri(), new Configuration(false));
    assertEquals(hadoops.getFileLinkStatus(link).isSymlink(), raw.getFileLinkStatus(link).isSymlink());
    assertEquals(hadoops.getFileLinkStatus(link).getPath(), raw.getFileLinkStatus(link).getPath());
  }
}
