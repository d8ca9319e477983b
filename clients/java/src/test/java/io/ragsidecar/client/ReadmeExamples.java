package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import javax.tools.DiagnosticCollector;
import javax.tools.JavaCompiler;
import javax.tools.JavaFileObject;
import javax.tools.StandardJavaFileManager;
import javax.tools.ToolProvider;

/**
 * A module's README examples compiled as written, so that the docs cannot drift from the code: each {@code ```java}
 * block goes, unchanged, into a compilation unit that declares what the README's surrounding text defines (the test
 * gives that scaffold per block), and javac compiles them all against the test class path. The only change a test may
 * make is {@link #onPort}: the sidecar's documented port becomes the test sidecar's, for a block it also runs.
 */
public final class ReadmeExamples {
  /** Where {@code make run} listens (config/ragsidecar.toml); the examples connect there. */
  public static final int DOCUMENTED_PORT = 50151;
  /** Where a scaffold puts the block's body. */
  public static final String EXAMPLE = "/* the README's example */";

  private static final Pattern JAVA_BLOCK = Pattern.compile("^```java\\n(.*?)^```$", Pattern.MULTILINE | Pattern.DOTALL);
  private static final Pattern XML_VERSION = Pattern.compile(
      "<artifactId>(ragsidecar-[\\w-]+)</artifactId>\\s*<version>([^<]+)</version>");

  private ReadmeExamples() {}

  /** The README of the module under test (surefire runs in the module's folder). */
  public static Path readme() {
    return Path.of("README.md").toAbsolutePath();
  }

  /** The bodies of a README's {@code ```java} blocks, in order. */
  public static List<Block> javaBlocks(Path readme) {
    Matcher m = JAVA_BLOCK.matcher(read(readme));
    List<Block> blocks = new ArrayList<>();
    while (m.find()) {
      blocks.add(Block.of(m.group(1)));
    }
    assertFalse(blocks.isEmpty(), readme + " has no java block");
    return blocks;
  }

  /** Checks that every ragsidecar dependency a README's XML shows has this version (the POM's). */
  public static void assertDependencyVersions(Path readme, String version) {
    Matcher m = XML_VERSION.matcher(read(readme));
    int found = 0;
    while (m.find()) {
      assertEquals(version, m.group(2), readme + ": the dependency on " + m.group(1));
      found++;
    }
    assertTrue(found > 0, readme + " shows no ragsidecar dependency");
  }

  /** A block with the documented port replaced by {@code port}, which it must connect to. */
  public static Block onPort(Block block, int port) {
    String documented = "port(" + DOCUMENTED_PORT + ")";
    assertTrue(block.body().contains(documented), "the example does not connect to the sidecar's port:\n" + block.body());
    return new Block(block.imports(), block.body().replace(documented, "port(" + port + ")"));
  }

  /**
   * A compilation unit of package {@code readme}: these imports, then the block's own, then {@code around} with the
   * block's body, as written, in place of {@value #EXAMPLE}.
   */
  public static String unit(String imports, Block block, String around) {
    assertTrue(around.contains(EXAMPLE), around);
    return "package readme;\n\n" + imports + "\n" + block.imports() + "\n\n" + around.replace(EXAMPLE, block.body()) + "\n";
  }

  /**
   * Compiles these units (top-level class name, e.g. {@code "readme.Connecting"}, to source) into {@code out} and
   * returns a class loader over them; javac's diagnostics, with the sources, fail the test.
   */
  public static ClassLoader compile(Map<String, String> units, Path out) {
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    DiagnosticCollector<JavaFileObject> diagnostics = new DiagnosticCollector<>();
    try (StandardJavaFileManager files = javac.getStandardFileManager(diagnostics, null, StandardCharsets.UTF_8)) {
      Path sources = Files.createDirectories(out.resolve("sources"));
      Path classes = Files.createDirectories(out.resolve("classes"));
      List<File> written = new ArrayList<>();
      for (Map.Entry<String, String> unit : units.entrySet()) {
        Path file = sources.resolve(unit.getKey().replace('.', '/') + ".java");
        Files.createDirectories(file.getParent());
        written.add(Files.writeString(file, unit.getValue()).toFile());
      }
      List<String> options = List.of("--release", "17", "-proc:none", "-classpath", testClassPath(),
          "-d", classes.toString());
      boolean ok = javac.getTask(null, files, diagnostics, options, null, files.getJavaFileObjectsFromFiles(written))
          .call();
      assertTrue(ok, () -> "the README's examples do not compile:\n" + diagnostics.getDiagnostics().stream()
          .map(Object::toString).collect(Collectors.joining("\n")) + "\n\n" + String.join("\n\n", units.values()));
      return new URLClassLoader(new URL[] {classes.toUri().toURL()}, ReadmeExamples.class.getClassLoader());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The test JVM's class path: surefire names it in a property (its own is a manifest-only jar). */
  private static String testClassPath() {
    return System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
  }

  private static String read(Path file) {
    try {
      return Files.readString(file);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** A README block: its leading import lines (which go at the top of a unit) and the rest, as written. */
  public record Block(String imports, String body) {
    static Block of(String text) {
      List<String> imports = new ArrayList<>();
      String[] lines = text.split("\n", -1);
      int i = 0;
      for (; i < lines.length && (lines[i].startsWith("import ") || lines[i].isBlank()); i++) {
        imports.add(lines[i]);
      }
      return new Block(String.join("\n", imports), String.join("\n", List.of(lines).subList(i, lines.length)));
    }
  }
}
