package org.apache.commons.lang3;

// Minimal stand-in for the one method the allocators use.
public class StringUtils {
    public static boolean isNoneEmpty(CharSequence... css) {
        for (CharSequence cs : css) {
            if (cs == null || cs.length() == 0) return false;
        }
        return true;
    }
}
