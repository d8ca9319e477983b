package io.ragsidecar.client;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolver;

/**
 * Injects a running {@link Sidecar} into test methods and {@code @BeforeAll} methods. Each distinct
 * {@link Options} starts one sidecar for the whole test run, kept in the root extension store: JUnit closes it (and
 * so stops the process) when the run ends, whether the tests passed or not.
 */
public final class SidecarExtension implements ParameterResolver {
  private static final ExtensionContext.Namespace NAMESPACE = ExtensionContext.Namespace.create(Sidecar.class);

  /** How the injected sidecar is started. */
  @Retention(RetentionPolicy.RUNTIME)
  @Target(ElementType.PARAMETER)
  public @interface Options {
    /** Bearer token the sidecar requires; empty requires none. */
    String token() default "";

    /** Also listen on a Unix socket. */
    boolean unixSocket() default false;

    /** Run on a temporary data folder and knowledge root ({@link Sidecar#knowledgeRoot()}). */
    boolean ownKnowledge() default false;
  }

  @Override
  public boolean supportsParameter(ParameterContext parameter, ExtensionContext context) {
    return parameter.getParameter().getType() == Sidecar.class;
  }

  @Override
  public Object resolveParameter(ParameterContext parameter, ExtensionContext context) {
    Options options = parameter.findAnnotation(Options.class).orElse(null);
    String token = options == null || options.token().isEmpty() ? null : options.token();
    boolean unix = options != null && options.unixSocket();
    boolean knowledge = options != null && options.ownKnowledge();
    String key = "sidecar token=" + token + " unix=" + unix + " knowledge=" + knowledge;
    return context.getRoot().getStore(NAMESPACE)
        .getOrComputeIfAbsent(key, k -> Sidecar.start(token, unix, knowledge), Sidecar.class);
  }
}
