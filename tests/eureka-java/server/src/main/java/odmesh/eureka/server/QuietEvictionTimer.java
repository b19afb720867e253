package odmesh.eureka.server;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.turbo.TurboFilter;
import ch.qos.logback.core.spi.FilterReply;
import org.slf4j.Marker;

/**
 * Drops Eureka's "Running the evict task" line, logged at INFO on every eviction run: the
 * tests evict every second, and the line would bury the registrations and cancels around it.
 */
public final class QuietEvictionTimer extends TurboFilter {

    @Override
    public FilterReply decide(Marker marker, Logger logger, Level level, String format, Object[] params,
            Throwable t) {
        return format != null && format.startsWith("Running the evict task") ? FilterReply.DENY : FilterReply.NEUTRAL;
    }
}
