package io.ragsidecar.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import org.junit.jupiter.api.Test;

/**
 * The suite runs on the protobuf-java line the build selected (3.25.x, which the classes are compiled against, by
 * default; 4.x with -Pprotobuf4, the same classes on the newer runtime), so a profile that silently kept the other
 * runtime fails here rather than proving nothing.
 */
class ProtobufRuntimeTest {

  @Test
  void runsOnTheSelectedProtobufJavaLine() {
    String selected = System.getProperty("ragsidecar.protobufVersion");
    assertNotNull(selected, "surefire passes the protobuf-java version under test");
    // com.google.protobuf.RuntimeVersion exists from protobuf-java 4.26 on and never in 3.x.
    assertEquals(!selected.startsWith("3."), classPresent("com.google.protobuf.RuntimeVersion"),
        "protobuf-java on the test class path is not the " + selected + " line");
  }

  private static boolean classPresent(String name) {
    try {
      Class.forName(name, false, ProtobufRuntimeTest.class.getClassLoader());
      return true;
    } catch (ClassNotFoundException e) {
      return false;
    }
  }
}
