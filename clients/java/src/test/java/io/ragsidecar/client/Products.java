package io.ragsidecar.client;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

/**
 * The appliance catalogue the adapters' tests search and rerank: five products, each about a different thing, so a
 * question about one has one right answer. {@link #write} puts them in a knowledge root as products.jsonl.
 */
public final class Products {
  /** The one about bread. */
  public static final String TOASTER = "The Toaster T4 browns four slices of bread at once and has a bagel setting.";

  /** Id to text, in the file's order: the toaster last. */
  public static final Map<String, String> BY_ID = catalogue();

  /** The texts of every product but the toaster, in the file's order. */
  public static final List<String> OTHERS = BY_ID.values().stream().filter(text -> !text.equals(TOASTER)).toList();

  private Products() {}

  /** Writes products.jsonl, one {@code {"id", "text"}} record a line, into {@code knowledgeRoot}. */
  public static void write(Path knowledgeRoot) throws IOException {
    String lines = BY_ID.entrySet().stream()
        .map(e -> "{\"id\": \"" + e.getKey() + "\", \"text\": \"" + e.getValue() + "\"}")
        .collect(Collectors.joining("\n", "", "\n"));
    Files.writeString(knowledgeRoot.resolve("products.jsonl"), lines, StandardCharsets.UTF_8);
  }

  private static Map<String, String> catalogue() {
    Map<String, String> products = new LinkedHashMap<>();
    products.put("kettle", "The Kettle K1 holds 1.7 litres of water and brings it to the boil in three minutes.");
    products.put("blender", "The Blender X2 has a 900 watt motor, six speeds and crushes ice for smoothies.");
    products.put("grinder", "The Grinder G3 grinds coffee beans with steel burrs in eighteen coarseness steps.");
    products.put("fridge", "The Fridge F9 keeps groceries cold with 350 litres of space and an ice dispenser.");
    products.put("toaster", TOASTER);
    return Collections.unmodifiableMap(products);
  }
}
