using System.Collections.Concurrent;
using System.Diagnostics.Metrics;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// Listens to the Kestrel.Transport.Linux meter of whatever host runs in the process (tests run one at a
/// time) and keeps, per instrument and tag value, the sum and the largest single measurement.
/// </summary>
internal sealed class TransportMeter : IDisposable
{
    private const string MeterName = "Kestrel.Transport.Linux";

    private readonly MeterListener _listener = new();
    private readonly ConcurrentDictionary<string, long> _sums = new();
    private readonly ConcurrentDictionary<string, long> _maxima = new();

    public TransportMeter()
    {
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Name == MeterName)
            {
                listener.EnableMeasurementEvents(instrument);
            }
        };
        _listener.SetMeasurementEventCallback<int>((instrument, value, tags, _) => Record(instrument, value, tags));
        _listener.SetMeasurementEventCallback<long>((instrument, value, tags, _) => Record(instrument, value, tags));
        _listener.Start();
    }

    /// <summary>Sum of an instrument's measurements, optionally only those with a tag of this value.</summary>
    public long Sum(string instrument, string? tagValue = null) => _sums.GetValueOrDefault(Key(instrument, tagValue));

    /// <summary>The largest single measurement.</summary>
    public long Max(string instrument, string? tagValue = null) => _maxima.GetValueOrDefault(Key(instrument, tagValue));

    public void Dispose() => _listener.Dispose();

    private static string Key(string instrument, string? tagValue) => tagValue is null ? instrument : instrument + "|" + tagValue;

    private void Record(Instrument instrument, long value, ReadOnlySpan<KeyValuePair<string, object?>> tags)
    {
        Add(Key(instrument.Name, null), value);
        foreach (var tag in tags)
        {
            Add(Key(instrument.Name, tag.Value?.ToString()), value);
        }
    }

    private void Add(string key, long value)
    {
        _sums.AddOrUpdate(key, value, (_, sum) => sum + value);
        _maxima.AddOrUpdate(key, value, (_, max) => Math.Max(max, value));
    }
}
